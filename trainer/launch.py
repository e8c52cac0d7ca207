"""How an island process is launched: its command line (which carries no secret: the
Redis URL and the island's key are in its environment), the environment of each rank of an island of
several processes, and its end: with its supervisor, and
without the interpreter's teardown."""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from typing import Any, NoReturn

import psutil

from syncd.environment import SettingError, number, text

# The island's environment variable with its launch time (time.time()).
LAUNCHED_AT_ENV = "ARCHIPELAGO_LAUNCHED_AT"
# ... and with the time its start or rejoin was asked for (trainer/phases.py).
ASKED_AT_ENV = "ARCHIPELAGO_ASKED_AT"
# ... and with the Redis URL, password and all: never on its command line, which `ps`,
# the island's log and a crash alert show to anyone who looks.
REDIS_URL_ENV = "ARCHIPELAGO_REDIS_URL"
# ... and with the data plane's (the Redis its update messages go to and its globals
# come from: syncd/run_keys.py), the same as REDIS_URL_ENV's when there is none.
DATAPLANE_URL_ENV = "ARCHIPELAGO_DATAPLANE_URL"
# ... and with its key for this epoch (hex, diloco.signing.island_key), which the control
# plane derived when it launched the epoch: the island never holds the run's secret.
ISLAND_KEY_ENV = "ARCHIPELAGO_ISLAND_KEY"
# The control plane's own credentials (webapp/settings.py), which the host's worker or
# pool manager may have in its environment: an island process is started without them
# (island_env), so it cannot read the database (every run's secret) or sign sessions.
CONTROL_PLANE_ENV = ("SECRET_KEY", "SECRET_KEY_FILE", "DATABASE_URL", "REDIS_URL",
                     "DATAPLANE_REDIS_URL", "METRICS_TOKEN")
_PR_SET_PDEATHSIG = 1


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def island_command(run_id: int, island: str, epoch: int, device: str | None = None
                   ) -> list[str]:
    """The island process's argv; `device` is given to an island of several processes,
    whose ranks above 0 need it before they have the run's spec. The Redis URL goes in
    its environment (REDIS_URL_ENV), not here."""
    command = [sys.executable, "-m", "trainer.runner", "--run", str(run_id),
               "--island", island, "--epoch", str(epoch)]
    return [*command, "--device", device] if device else command


def island_env(base: dict[str, str]) -> dict[str, str]:
    """An island process's environment: its launcher's, without the control plane's
    credentials (CONTROL_PLANE_ENV), output unbuffered."""
    return {**{k: v for k, v in base.items() if k not in CONTROL_PLANE_ENV},
            "PYTHONUNBUFFERED": "1"}


def island_key_from_env() -> bytes:
    """The island's key that its launcher put in this process's environment.

    Raises:
        ValueError: none there, or not hex.
    """
    value = text(ISLAND_KEY_ENV)
    if not value:
        raise ValueError(f"the island's key must be in the environment variable "
                         f"{ISLAND_KEY_ENV}")
    return bytes.fromhex(value)


def island_processes(spec: dict[str, Any] | None, island: str) -> tuple[int, str]:
    """(processes, train.device) of an island in a run spec; (1, "auto") if it is not there."""
    config = (spec or {}).get("config", {})
    processes = next((i.get("processes", 1) for i in config.get("islands", [])
                      if i.get("name") == island), 1)
    return processes, config.get("train", {}).get("device", "auto")


def end_with_parent(parent_pid: int) -> Callable[[], None] | None:
    """In the child before exec: SIGTERM when the supervisor dies (Linux only).

    A worker that is killed must not leave its islands training unsupervised,
    beyond the reach of kill and stop; SIGTERM lets the loop save its cursor.
    """
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(1)

    return preexec


def process_started_at() -> float | None:
    """When this process was exec'd (time.time() seconds, to the kernel's clock tick);
    None where the system does not say. psutil's create_time counts from a boot time
    in whole seconds; less that boot time, it is the seconds since boot to the tick,
    which the clock since boot turns into this clock's time."""
    try:
        since_boot = psutil.Process().create_time() - psutil.boot_time()
        return time.time() - (time.clock_gettime(time.CLOCK_BOOTTIME) - since_boot)
    except (psutil.Error, AttributeError):  # AttributeError: no CLOCK_BOOTTIME
        return None


def env_time(name: str) -> float | None:
    """A time (seconds) that the supervisor put in this process's environment."""
    try:
        return number(name)
    except SettingError:  # none there, or not a number
        return None


def rank_env(rank: int, world_size: int, port: int) -> dict[str, str]:
    """torchrun's environment for one process of a one-host group."""
    return {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
            "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size)}


def exit_now(code: int) -> NoReturn:
    """Exit at once, without the interpreter's teardown, once a program's work is done.

    With torch loaded the teardown takes seconds, more on a busy host where
    everything stops at once, and a stop has 10 s for all
    (`python -m webapp.start` uses it too).
    """
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
