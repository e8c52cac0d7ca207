"""The real system for a benchmark: its own Redis, SQLite database, syncd and, as
asked, Daphne and a Celery worker per region, all under one folder of its own
(BenchSystem); or the README's start command itself, `python -m webapp.start`, under
a folder of its own (StartedSystem).

This process is pointed at the same Redis and database (Django set up),
so a benchmark creates and starts runs through the run services, as the web app does.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import redis

from bench import results
from trainer.launch import free_port
from webapp.processes import (
    PROJECT_ROOT,
    Managed,
    ProcessManager,
    port_accepts,
    redis_argv,
    redis_server_binary,
    wait_for,
)

ROOT = Path(__file__).resolve().parent.parent
STARTUP_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 60.0


class BenchSystem:
    """Args:
        home: the folder for the system's state; emptied first.
        regions: the deployment's regions (REGIONS).
        appendonly: give Redis an append-only file, as `python -m webapp.start` does,
            so that a restart of Redis keeps what it held (the chaos soak restarts it);
            without it Redis keeps nothing on disk.
        extra_env: more environment for every process (SYNCD_LEASE_TTL_S, ...).
        maxmemory_mb: Redis's memory limit (noeviction), as `python -m webapp.start`
            gives it (to each Redis).
        dataplane: a second Redis, with nothing on disk, for the tensor messages
            (DATAPLANE_REDIS_URL), as `python -m webapp.start` starts it.
    """

    def __init__(self, home: Path, regions: list[str], appendonly: bool = False,
                 extra_env: dict[str, str] | None = None, maxmemory_mb: int | None = None,
                 dataplane: bool = False):
        shutil.rmtree(home, ignore_errors=True)
        (home / "redis").mkdir(parents=True)
        self.home, self.regions = home, regions
        self.processes = ProcessManager(home / "logs", cwd=ROOT)
        self.redis_port = free_port()
        self.redis_url = f"redis://127.0.0.1:{self.redis_port}/0"
        self.web_url: str | None = None
        self.env = {**os.environ, "REDIS_URL": self.redis_url,
                    "DATABASE_URL": f"sqlite:///{home / 'db.sqlite3'}",
                    "CHECKPOINT_DIR": str(home / "checkpoints"), "LOG_DIR": str(home / "logs"),
                    "DJANGO_SETTINGS_MODULE": "webapp.settings", "PYTHONPATH": str(ROOT),
                    "REGIONS": ",".join(regions), "PYTHONUNBUFFERED": "1",
                    **(extra_env or {})}
        self.processes.start("redis", redis_argv(redis_server_binary(), self.redis_port,
                                                 home / "redis", appendonly=appendonly,
                                                 maxmemory_mb=maxmemory_mb),
                             env=self.env, stop_last=True)
        self.wait_redis()
        self.dataplane_url: str | None = None
        if dataplane:
            (home / "dataplane").mkdir()
            port = free_port()
            self.dataplane_url = f"redis://127.0.0.1:{port}/0"
            self.env["DATAPLANE_REDIS_URL"] = self.dataplane_url
            self.processes.start("dataplane", redis_argv(
                redis_server_binary(), port, home / "dataplane", appendonly=False,
                maxmemory_mb=maxmemory_mb), env=self.env, stop_last=True)
            self.wait_redis(url=self.dataplane_url)

    def wait_redis(self, timeout: float = 60.0, url: str | None = None) -> None:
        """Until Redis (`url`, the control Redis by default) answers a PING: listening
        is not enough, since a Redis that reads its append-only file answers "loading"
        to everything else."""
        client = redis.Redis.from_url(url or self.redis_url, socket_timeout=1)

        def answers() -> bool:
            try:
                return bool(client.ping())
            except redis.RedisError:
                return False

        try:
            wait_for(answers, timeout, "the benchmark's Redis answering", 0.1)
        finally:
            client.close()

    def setup_django(self) -> None:
        """Point this process at the system's Redis and database and migrate."""
        os.environ.update({k: self.env[k] for k in ("REDIS_URL", "DATABASE_URL",
                                                     "CHECKPOINT_DIR", "LOG_DIR", "REGIONS",
                                                     "DATAPLANE_REDIS_URL") if k in self.env})
        os.environ["DJANGO_SETTINGS_MODULE"] = "webapp.settings"
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", interactive=False, verbosity=0)

    def start_syncd(self, restart: bool = False) -> None:
        """syncd; with restart, `check` starts it again when it dies."""
        self.processes.start("syncd", [sys.executable, str(PROJECT_ROOT / "manage.py"), "syncd"],
                             env=self.env, restart=restart)

    def start_workers(self, concurrency: int = 3, restart: bool = False) -> None:
        for region in self.regions:
            self.processes.start(f"worker-{region}", [
                sys.executable, "-m", "celery", "-A", "webapp", "worker", "-Q",
                f"region.{region}", "--concurrency", str(concurrency), "--pool", "prefork",
                "-n", f"{region}@bench", "--without-gossip", "--without-mingle",
                "--loglevel", "WARNING"], env=self.env, restart=restart)

    def start_pools(self, size: int = 1, restart: bool = False) -> None:
        """A pool manager per region (trainer/pool_manager.py) keeping `size` warm
        standby islands, as `python -m webapp.start` starts them."""
        for region in self.regions:
            self.processes.start(f"pool-{region}", [
                sys.executable, str(PROJECT_ROOT / "manage.py"), "pool_manager", "--region", region,
                "--size", str(size)], env=self.env, restart=restart)

    def pid(self, name: str) -> int:
        """The pid of a managed process (it leads a process group of the same number)."""
        return self._managed(name).process.pid

    def kill9_and_restart(self, name: str, timeout: float = 20.0) -> int:
        """SIGKILL a process's whole group at once (kill -9, no goodbye) and start it again
        at once with the same command and log; returns the new pid."""
        process = self._managed(name).process
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=timeout)
        process = self.processes.start_again(name)
        if name == "redis":
            self.wait_redis(timeout)
        return process.pid

    def stop_process(self, name: str, timeout: float = 20.0) -> int | None:
        """SIGTERM a managed process's group, wait for it to exit (SIGKILL after
        `timeout`) and stop managing it; returns its exit code."""
        managed = self._managed(name)
        self.processes.managed.remove(managed)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(managed.process.pid, signal.SIGTERM)
        try:
            return managed.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(managed.process.pid, signal.SIGKILL)
            return managed.process.wait(timeout=timeout)

    def group_ids(self) -> list[int]:
        """The process group of every managed process (each is a session leader)."""
        return [m.process.pid for m in self.processes.managed]

    def _managed(self, name: str) -> Managed:
        for managed in self.processes.managed:
            if managed.name == name:
                return managed
        names = ", ".join(m.name for m in self.processes.managed)
        raise KeyError(f"no process named {name!r} is managed (there are: {names})")

    def start_web(self) -> str:
        """Daphne on a free loopback port; returns its base URL once it answers."""
        port = free_port()
        self.processes.start("web", [sys.executable, "-m", "daphne", "-b", "127.0.0.1",
                                     "-p", str(port), "webapp.asgi:application"], env=self.env)
        wait_for(lambda: port_accepts(port), 60, "Daphne")
        self.web_url = f"http://127.0.0.1:{port}"
        return self.web_url

    def stop(self) -> None:
        for name, code in self.processes.stop_all().items():
            results.say(f"  stopped {name} ({code})")


class StartedSystem:
    """`python -m webapp.start` as a user runs it (Redis, syncd, a worker and a pool
    manager per region, the control worker, the web app, the demo run), with its state
    under `home`, emptied first: VAR_DIR, SQLite, checkpoints, logs and DATA_DIR; the
    web app on a free port. The pool and the workers keep their defaults."""

    def __init__(self, home: Path, regions: list[str]):
        shutil.rmtree(home, ignore_errors=True)
        (home / "data").mkdir(parents=True)
        self.home, self.log = home, home / "start.log"
        self.env = {**os.environ, "VAR_DIR": str(home / "var"),
                    "DATABASE_URL": f"sqlite:///{home / 'db.sqlite3'}",
                    "CHECKPOINT_DIR": str(home / "checkpoints"), "LOG_DIR": str(home / "logs"),
                    "DATA_DIR": str(home / "data"), "PORT": str(free_port()),
                    "REGIONS": ",".join(regions), "DJANGO_SETTINGS_MODULE": "webapp.settings",
                    "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
        for name in ("REDIS_URL", "ISLAND_POOL_SIZE", "ISLANDS_PER_WORKER"):
            self.env.pop(name, None)
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen([sys.executable, "-m", "webapp.start"], cwd=ROOT,
                                            env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        wait_for(self.up, STARTUP_TIMEOUT_S, "python -m webapp.start up", 0.5)
        port = int((home / "var" / "redis" / "port").read_text())
        self.redis_url = f"redis://127.0.0.1:{port}/0"

    @property
    def pid(self) -> int:
        return self.process.pid

    def up(self) -> bool:
        """Whether the start says it is running; raises if it has exited."""
        self.check()
        return "Archipelago is running" in self.log.read_text(errors="replace")

    def check(self) -> None:
        if self.process.poll() is not None:
            raise RuntimeError(f"python -m webapp.start exited with code "
                               f"{self.process.returncode}; see {self.log}")

    def setup_django(self) -> None:
        """Point this process at the system's Redis, database and folders (the start
        has migrated)."""
        os.environ.update({k: self.env[k] for k in ("DATABASE_URL", "CHECKPOINT_DIR",
                                                     "LOG_DIR", "DATA_DIR", "REGIONS")})
        os.environ["REDIS_URL"] = self.redis_url
        os.environ["DJANGO_SETTINGS_MODULE"] = "webapp.settings"
        import django

        django.setup()

    def stop(self) -> None:
        """Ctrl-C's SIGTERM; the whole group SIGKILLed if it has not stopped in a minute."""
        self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            code = self.process.wait()
        results.say(f"  python -m webapp.start stopped ({code})")
