"""Supervise one epoch of an island: its training process and the commands sent to it.

An island is one long Celery task on its region's worker. The task does not
train: it starts the training loop (`python -m trainer.runner`) as a child
process and watches the island's control list in Redis, so that a "kill" fault
is carried out on the island's own host, mid-step, whichever machine asked for
it (docs/ARCHITECTURE.md, Processes). The child is started with subprocess because
Celery's prefork pool processes are daemonic and multiprocessing refuses them
children of their own.

An island of several processes (islands[].processes) is that many copies of
the command, started together with torchrun's environment (MASTER_ADDR,
MASTER_PORT, RANK, LOCAL_RANK, WORLD_SIZE); each command below goes to every
one of them, and when one fails the others are killed: a rank alone cannot go on.

Commands (JSON objects in the island's control list, see syncd.store):
    kill     SIGKILL at once: the island dies mid-step, as a crashed host would.
             {"report": false} keeps the death to itself (a region outage: a region
             that has gone dark tells no one; syncd finds out by the heartbeat timeout).
    stop     SIGTERM: the loop finishes its step, saves its data cursor and exits 0;
             SIGKILL if it is still there after the grace period.
    pause    SIGSTOP.
    resume   SIGCONT.
A command may name an epoch. One for an older epoch is dropped; one for a
newer epoch is put back for it. An epoch that is no longer the island's
current one (a rejoin started the next) stops itself, so a rejoin
never leaves two copies of an island training, even if its "stop" went astray.

A death (killed, or failed on its own) is reported at once to the run's store with
its epoch and exit code (IslandSignals.report_death), so syncd marks the island lost as
it happens rather than when its heartbeat times out. The loop waits on the child
between polls, so it sees an exit within milliseconds.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, Protocol

import redis

from trainer.island_logs import island_log_path, tail_lines
from trainer.launch import (
    ASKED_AT_ENV,
    DATAPLANE_URL_ENV,
    ISLAND_KEY_ENV,
    LAUNCHED_AT_ENV,
    REDIS_URL_ENV,
    end_with_parent,
    free_port,
    island_command,
    island_env,
    island_processes,
    rank_env,
)

PROJECT_ROOT = Path(__file__).resolve().parent.parent
POLL_S = 0.2
# How often the log's last lines go to Redis (for the control room, on any host).
LOG_SHIP_S = 2.0
LOG_SHIP_LINES = 200
STOP_GRACE_S = 30.0
# Commands taken from the control list per poll; more wait for the next poll.
COMMANDS_PER_POLL = 16


class SignalStore(Protocol):
    """What the supervisor needs of a run's island signals (syncd.island_signals)."""

    def next_command(self, island: str) -> dict[str, Any] | None: ...

    def send_command(self, island: str, kind: str, **args: Any) -> None: ...

    def put_log(self, island: str, lines: list[str]) -> None: ...

    def report_death(self, island: str, epoch: int, exit_code: int | None,
                     at: float | None = None) -> None: ...


class ControlStore(Protocol):
    """What the supervisor needs of a syncd.store.RunStore."""

    @property
    def signals(self) -> SignalStore: ...

    def epochs(self) -> dict[str, int]: ...


class IslandSupervisor:
    """Runs one island process to its end and carries out the commands sent to it.

    Args:
        command: the island process's argv.
        store: where the island's commands and current epoch are read (a RunStore).
        island: the island's name.
        epoch: the number of this start of the island.
        log_path: the child's stdout and stderr are appended here, with a line from
            the supervisor when it starts and when it ends.
        poll_s: seconds between two looks at the control list and the child.
        stop_grace_s: seconds a stopped child has to exit before it is killed.
        env: the child's environment; default: this process's.
        cwd: the child's working directory; default: the project root.
        processes: copies of the command to start, as ranks of one process group.
    """

    def __init__(self, command: Sequence[str], store: ControlStore, island: str, epoch: int,
                 log_path: str | Path, *, poll_s: float = POLL_S,
                 stop_grace_s: float = STOP_GRACE_S, env: dict[str, str] | None = None,
                 cwd: str | Path | None = None, processes: int = 1):
        if not command:
            raise ValueError("command must name the program to run, got an empty list")
        if processes < 1:
            raise ValueError(f"processes must be 1 or more, got {processes}")
        if poll_s <= 0:
            raise ValueError(f"poll_s must be more than 0 seconds, got {poll_s}")
        if stop_grace_s < 0:
            raise ValueError(f"stop_grace_s must be 0 seconds or more, got {stop_grace_s}")
        self.command = list(command)
        self.store = store
        self.island = island
        self.epoch = epoch
        self.log_path = Path(log_path)
        self.poll_s = poll_s
        self.stop_grace_s = stop_grace_s
        self.env = env
        self.cwd = cwd if cwd is not None else PROJECT_ROOT
        self.processes = processes
        self.children: list[subprocess.Popen[bytes]] = []
        self._failure: int | None = None  # the exit code of the first rank that failed
        self._log: IO[bytes] | None = None
        self._paused = False
        self._store_down = False
        self._sigterm = False
        self._shipped = (-1, 0.0)  # the log's size when last shipped, and when
        self._report = True  # whether a death is reported (not in a region outage)
        self._died_at: float | None = None

    def run(self, handle_sigterm: bool = False,
            adopt: list[subprocess.Popen[bytes]] | None = None) -> dict[str, Any]:
        """Start the island process, supervise it until it ends, and say how it ended.

        Args:
            handle_sigterm: treat a SIGTERM to this process as a "stop" (main thread
                only). A Celery worker shut down with its process group then stops its
                islands as a stop command would, and its tasks end instead of dying.
            adopt: processes already running (a claimed warm standby, a child of this
                process) to supervise instead of starting the command.

        Returns:
            {"island", "epoch", "exit_code", "ended"}, with "ended" one of: exited
            (0, on its own), failed (non-zero on its own; "log_tail" says why), killed,
            stopped, superseded (a newer epoch took over; exit_code None if the
            process was never started). A stop that needed SIGKILL adds "forced".
        """
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as self._log:
            if self._superseded():
                self._note(f"epoch {self.epoch} not started: a newer epoch took over")
                for child in adopt or ():
                    child.kill()  # a claimed standby must not train for an old epoch
                    child.wait()
                return self._result("superseded", None)
            previous = signal.signal(signal.SIGTERM, self._on_sigterm) if handle_sigterm \
                else None
            try:
                if adopt:
                    self.children = list(adopt)
                    self._note(f"start epoch {self.epoch} on warm standby "
                               f"{', '.join(str(c.pid) for c in adopt)}")
                else:
                    times = f" x {self.processes}" if self.processes > 1 else ""
                    self._note(f"start epoch {self.epoch}: {shlex.join(self.command)}{times}")
                    self._start()
                ended, forced = self._watch()
            finally:
                if handle_sigterm:
                    signal.signal(signal.SIGTERM, previous)
            code = self._exit_code()
            if ended in ("killed", "failed"):
                self._report_death(code)
            self._note(f"epoch {self.epoch} ended ({ended}), exit code {code}")
        self._ship_log(force=True)
        result = self._result(ended, code)
        if forced:
            result["forced"] = True
        if ended == "failed":
            result["log_tail"] = tail_lines(self.log_path, 20)
        return result

    def request_stop(self) -> None:
        """Stop the island as a "stop" command would (from any thread)."""
        self._sigterm = True

    @property
    def child(self) -> subprocess.Popen[bytes] | None:
        """The island's process (its rank 0); None before it started."""
        return self.children[0] if self.children else None

    def _start(self) -> None:
        # The launch time, so the island's start-up (elastic's restart delay) counts
        # the interpreter and its imports too.
        base = {**(self.env if self.env is not None else os.environ),
                LAUNCHED_AT_ENV: repr(time.time())}
        envs = [base]
        if self.processes > 1:
            port = free_port()
            envs = [{**base, **rank_env(rank, self.processes, port)}
                    for rank in range(self.processes)]
        for env in envs:
            self.children.append(subprocess.Popen(
                self.command, stdin=subprocess.DEVNULL, stdout=self._log,
                stderr=subprocess.STDOUT, env=env, cwd=self.cwd,
                preexec_fn=end_with_parent(os.getpid())))

    def _report_death(self, code: int | None) -> None:
        if not self._report:
            self._note("death not reported (a dark region tells no one)")
            return
        self._store_call(self.store.signals.report_death, self.island, self.epoch, code,
                         at=self._died_at)

    def _exit_code(self) -> int | None:
        if self._failure is not None:
            return self._failure
        return next((c.returncode for c in self.children if c.returncode), 0)

    # -- the loop -------------------------------------------------------------

    def _watch(self) -> tuple[str, bool]:
        """Poll the children and the commands until they are gone: (how it ended, forced)."""
        ended: str | None = None
        stop_deadline: float | None = None
        while True:
            codes = [c.poll() for c in self.children]
            if None not in codes:
                self._died_at = time.time()
                if ended is None and self._sigterm and not any(codes):
                    ended = "stopped"  # it got the same SIGTERM and ended before the look
                return ended or ("exited" if not any(codes) else "failed"), False
            failed = next(((r, c) for r, c in enumerate(codes) if c), None)
            if failed is not None:
                self._died_at = time.time()
                self._failure = failed[1]
                self._note(f"process {failed[0]} of {len(codes)} ended with exit code "
                           f"{failed[1]}: SIGKILL to the others")
                self._kill()
                return ended or "failed", False
            if stop_deadline is not None and time.monotonic() >= stop_deadline:
                self._note(f"still running {self.stop_grace_s:g} s after SIGTERM: SIGKILL")
                self._kill()
                return ended or "stopped", True
            if self._sigterm and stop_deadline is None:
                self._note("SIGTERM: stopping")
                ended, stop_deadline = "stopped", self._terminate()
            if ended != "superseded":
                if self._superseded():
                    self._note("a newer epoch of this island started: stopping")
                    ended, stop_deadline = "superseded", self._terminate()
                    continue
                for command in self._commands():
                    kind = command.get("kind")
                    if kind == "kill":
                        self._note("kill: SIGKILL")
                        self._report = command.get("report", True) is not False
                        self._died_at = time.time()
                        self._kill()
                        return "killed", False
                    if kind == "stop" and stop_deadline is None:
                        self._note("stop: SIGTERM")
                        ended, stop_deadline = "stopped", self._terminate()
                    elif kind == "pause" and stop_deadline is None:
                        self._note("pause: SIGSTOP")
                        self._signal(signal.SIGSTOP)
                        self._paused = True
                    elif kind == "resume" and self._paused:
                        self._note("resume: SIGCONT")
                        self._signal(signal.SIGCONT)
                        self._paused = False
                    elif kind not in ("stop", "pause", "resume"):
                        self._note(f"unknown command {command!r} ignored")
            self._ship_log()
            self._wait_child(self.poll_s)

    def _wait_child(self, seconds: float) -> None:
        """Sleep up to `seconds`, less if the island's process (rank 0) ends."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.children[0].wait(timeout=seconds)

    def _ship_log(self, force: bool = False) -> None:
        """Put the log's last lines in Redis when it grew, at most every LOG_SHIP_S."""
        size, at = self._shipped
        now = time.monotonic()
        if not force and now - at < LOG_SHIP_S:
            return
        current = self.log_path.stat().st_size if self.log_path.exists() else 0
        if current != size:
            self._store_call(self.store.signals.put_log, self.island,
                             tail_lines(self.log_path, LOG_SHIP_LINES))
        self._shipped = (current, now)

    def _commands(self) -> list[dict[str, Any]]:
        """Take this epoch's pending commands; drop older ones, put newer ones back."""
        mine = []
        for _ in range(COMMANDS_PER_POLL):
            command = self._store_call(self.store.signals.next_command, self.island)
            if command is None:
                break
            epoch = command.get("epoch")
            if epoch is None or epoch == self.epoch:
                mine.append(command)
            elif epoch < self.epoch:
                self._note(f"command for older epoch {epoch} dropped: {command!r}")
            else:
                # For the epoch that replaces us: leave it to that one, and take
                # nothing more this round so we do not pick the same command again.
                args = {k: v for k, v in command.items() if k != "kind"}
                self._store_call(self.store.signals.send_command, self.island, command["kind"],
                                 **args)
                break
        return mine

    def _superseded(self) -> bool:
        epochs = self._store_call(self.store.epochs)
        return bool(epochs) and epochs.get(self.island, self.epoch) > self.epoch

    def _on_sigterm(self, signum: int, frame: object) -> None:
        self._sigterm = True

    def _terminate(self) -> float:
        """SIGTERM (and SIGCONT, or a paused child never sees it); returns the kill deadline."""
        self._signal(signal.SIGTERM)
        if self._paused:
            self._signal(signal.SIGCONT)
            self._paused = False
        return time.monotonic() + self.stop_grace_s

    def _signal(self, sig: int) -> None:
        for child in self.children:
            with contextlib.suppress(ProcessLookupError):  # it ended since our last poll
                child.send_signal(sig)

    def _kill(self) -> None:
        self._signal(signal.SIGKILL)
        for child in self.children:
            child.wait()

    def _store_call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Call the store; while Redis is away the island keeps training, unsupervised."""
        try:
            value = fn(*args, **kwargs)
        except (redis.RedisError, OSError) as e:
            if not self._store_down:
                self._note(f"cannot reach Redis ({e}); the island keeps running")
                self._store_down = True
            return None
        if self._store_down:
            self._note("Redis is back")
            self._store_down = False
        return value

    def _note(self, message: str) -> None:
        if self._log is None:
            return
        stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S")
        self._log.write(f"[supervisor {stamp}] {message}\n".encode())
        self._log.flush()

    def _result(self, ended: str, code: int | None) -> dict[str, Any]:
        return {"island": self.island, "epoch": self.epoch, "exit_code": code, "ended": ended}


# -- the Celery task's body --------------------------------------------------------

def supervise_island(run_id: int, island: str, epoch: int, redis_url: str, island_key: str,
                     log_dir: str | Path, asked_at: float | None = None,
                     redis_password: str | None = None, dataplane_url: str | None = None
                     ) -> dict[str, Any]:
    """Run one epoch of an island unless its run is no longer active or stopping;
    `island_key` (hex) is the key the control plane derived for this epoch, given to the
    island in its environment; `asked_at`, when its start or rejoin was asked for,
    starts its dispatch phase (trainer/phases.py). The supervisor connects with
    `redis_url`; the island, with `redis_password`, as its run's island user
    (syncd/acl.py), or with `redis_url` where there is none (None); `dataplane_url` is
    where its tensor messages go (default `redis_url`'s Redis), as the same user."""
    from syncd.acl import island_url
    from syncd.connection import connect
    from syncd.store import RunStore

    store = RunStore(connect(redis_url), run_id)
    if not store.is_active() or store.control.stop_requested() is not None:
        return {"island": island, "epoch": epoch, "exit_code": None, "ended": "inactive"}
    env = {**island_env(dict(os.environ)),
           REDIS_URL_ENV: island_url(redis_url, run_id, redis_password),
           DATAPLANE_URL_ENV: island_url(dataplane_url or redis_url, run_id, redis_password),
           ISLAND_KEY_ENV: island_key}
    if asked_at is not None:
        env[ASKED_AT_ENV] = repr(float(asked_at))
    processes, device = island_processes(store.spec(), island)
    command = island_command(run_id, island, epoch, device if processes > 1 else None)
    supervisor = IslandSupervisor(command, store, island, epoch,
                                  island_log_path(log_dir, run_id, island), env=env,
                                  processes=processes)
    # Celery's pool processes die of SIGTERM by default: the island would be left
    # without its supervisor, and the task would fail as a lost worker.
    return supervisor.run(handle_sigterm=threading.current_thread() is threading.main_thread())
