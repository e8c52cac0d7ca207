"""The database tier's databases: each answers, or a throwaway PostgreSQL takes the
place of a local one where nothing listens, or the tier stops with why."""

import os
import shutil
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from bench import postgres
from tests.databases import ROOT, main, throwaway_postgres
from trainer.launch import free_port
from webapp.processes import port_accepts


def saving_url(path: Path) -> list[str]:
    """A command that connects to DATABASE_URL, writes a row and notes the URL in `path`."""
    return [sys.executable, "-c", textwrap.dedent(f"""
        import os, psycopg
        url = os.environ["DATABASE_URL"]
        with psycopg.connect(url) as db:
            db.execute("create table merges (version int)")
            db.execute("insert into merges values (7)")
        open({str(path)!r}, "w").write(url)
    """)]


@pytest.fixture
def var(monkeypatch):
    """A folder in the checkout's var/, as under make: run as root, the throwaway server
    runs as nobody, who may not enter pytest's temporary folders."""
    (ROOT / "var").mkdir(exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="test-databases-", dir=ROOT / "var"))
    folder.chmod(0o755)
    monkeypatch.setenv("VAR_DIR", str(folder))
    yield folder
    shutil.rmtree(folder)


def test_a_local_postgres_where_nothing_listens_is_replaced_by_a_throwaway_one(var, tmp_path):
    nothing = f"postgres://postgres@127.0.0.1:{free_port()}/archipelago"
    seen = tmp_path / "seen"

    assert main([nothing, "--", *saving_url(seen)]) == 0

    ours = seen.read_text()
    assert ours.startswith("postgres://postgres@127.0.0.1:") and ours.endswith("/archipelago")
    assert ours != nothing
    port = int(ours.rsplit(":", 1)[1].split("/")[0])
    assert not port_accepts(port)  # stopped afterwards
    assert list(var.iterdir()) == []  # and its data deleted


def test_a_postgres_that_answers_is_used_as_it_is(var, tmp_path):
    seen = tmp_path / "seen"
    with throwaway_postgres(f"postgres://postgres@127.0.0.1:{free_port()}/runs", var) as url:
        assert main([url, "--", *saving_url(seen)]) == 0

    assert seen.read_text() == url


def test_a_postgres_elsewhere_that_does_not_answer_stops_the_tier(var, capsys):
    # 127.0.0.2 is on loopback, but not this machine's name for itself: "elsewhere".
    elsewhere = f"postgres://postgres:secret@127.0.0.2:{free_port()}/archipelago"

    assert main([elsewhere, "--", sys.executable, "-c", "raise SystemExit(3)"]) == 1

    err = capsys.readouterr().err
    assert err.startswith("Cannot run the database tests: the PostgreSQL at "
                          "postgres://postgres:***@127.0.0.2:")
    assert "does not answer" in err and "secret" not in err


def test_the_command_runs_once_per_database_and_its_failure_is_the_result(var, tmp_path):
    first, second = (f"sqlite:///{tmp_path / name}" for name in ("a.sqlite3", "b.sqlite3"))
    log = tmp_path / "log"
    note = [sys.executable, "-c", f"import os; open({str(log)!r}, 'a').write("
                                  "os.environ['DATABASE_URL'] + '\\n'); raise SystemExit(4)"]

    assert main([first, second, "--", *note]) == 4

    assert log.read_text().splitlines() == [first]  # stopped at the first failure


@pytest.mark.skipif(os.geteuid() != 0, reason="only root runs the server as nobody")
def test_a_checkout_nobody_may_enter_gets_its_throwaway_server_from_the_temporary_folder(
        var, monkeypatch, tmp_path):
    monkeypatch.setattr(postgres, "others_can_enter", lambda path: False)  # under /root
    seen = tmp_path / "seen"

    with throwaway_postgres(f"postgres://postgres@127.0.0.1:{free_port()}/runs", var) as url:
        assert main([url, "--", *saving_url(seen)]) == 0

    assert seen.read_text() == url
    assert list(var.iterdir()) == []  # nothing of it in the checkout
