"""The fixtures that more than one folder of tests uses, in one place: users of each role
and their signed-in clients, island tasks recorded instead of sent, the data roots the
tests' corpora live under, a data folder of one's own, the demo form's post, a manager
of the one-command start's processes, a running run of three islands, a whole system
of its own; and `wait_until`, the one way the tests wait for something to happen, and the
small helpers several test files share: `python` (a command line of a Python snippet),
`tagged` (a message with its island's tag) and `redis_users` (the users a Redis has).

A viewer may look; an operator (a member of the "operators" group) may create, run,
break and heal runs; an admin (a superuser) may do everything. The users have no
password (hashing one takes a third of a second); clients log in with force_login.

A folder's conftest.py imports the ones its tests use.
"""

import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import blake3
import pytest
import redis
from django.test import Client

from tests.webapp.runs.three_islands import THREE_ISLANDS
from webapp.processes import ProcessManager
from webapp.runs.models import Run
from webapp.runs.roles import operators_group


def wait_until(condition: Callable[[], object], timeout: float = 10.0,
               what: str = "the condition", process: subprocess.Popen | None = None,
               interval: float = 0.05) -> object:
    """Poll `condition` every `interval` seconds until it returns something true, and
    return that; AssertionError naming `what` after `timeout` seconds, or as soon as
    `process` (if given) has exited."""
    deadline = time.monotonic() + timeout
    while True:
        if process is not None and process.poll() is not None:
            raise AssertionError(f"{process.args} exited ({process.returncode}) while "
                                 f"waiting for {what}")
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def python(code: str) -> list[str]:
    """The command line that runs the Python snippet `code` (dedented) in a process."""
    return [sys.executable, "-c", textwrap.dedent(code)]


def tagged(body: bytes, key: bytes) -> bytes:
    """`body` ended by its tag: its BLAKE3 hash keyed with the island's key, as an
    island sends an update (diloco/protocol.py)."""
    return body + blake3.blake3(body, key=key).digest()


def redis_users(client: redis.Redis) -> set[str]:
    """The users a Redis has (ACL USERS): the default one and each island's."""
    return {u.decode() for u in client.execute_command("ACL", "USERS")}


@pytest.fixture
def viewer(django_user_model):
    return django_user_model.objects.create_user("vera")


@pytest.fixture
def operator(django_user_model):
    """A member of the "operators" group (migration runs.0003_roles gives it its rights)."""
    user = django_user_model.objects.create_user("otto")
    user.groups.add(operators_group())
    return user


@pytest.fixture
def admin(django_user_model):
    return django_user_model.objects.create_user("ada", is_staff=True, is_superuser=True)


@pytest.fixture
def viewer_client(viewer) -> Client:
    client = Client()
    client.force_login(viewer)
    return client


@pytest.fixture
def operator_client(operator) -> Client:
    client = Client()
    client.force_login(operator)
    return client


@pytest.fixture
def admin_client(admin) -> Client:
    client = Client()
    client.force_login(admin)
    return client


@pytest.fixture
def enqueued(monkeypatch):
    """Island tasks the services send, recorded instead of going to a broker."""
    from webapp.runs.tasks import run_island

    sent: list[dict] = []

    def apply_async(args=None, kwargs=None, **options):
        sent.append({"args": list(args or []), **options})

    monkeypatch.setattr(run_island, "apply_async", apply_async)
    return sent


@pytest.fixture(autouse=True)
def _data_roots(settings, tmp_path_factory):
    """The tests' runs may read corpora from the tests' temporary folders (a run a user
    creates must name a data.path inside settings.DATA_ROOTS)."""
    settings.DATA_ROOTS = [*settings.DATA_ROOTS, tmp_path_factory.getbasetemp()]


@pytest.fixture
def data_root(tmp_path, settings) -> Path:
    """The only data folder, with a corpus in it and a secret beside it."""
    root = tmp_path / "data"
    (root / "corpus").mkdir(parents=True)
    (root / "corpus" / "text.txt").write_text("islands " * 1000)
    (tmp_path / "secret.txt").write_text("the password file")
    settings.DATA_ROOTS = [root]
    return root



@pytest.fixture
def new_run_form(settings) -> dict[str, str]:
    """What the browser posts on /runs/new/ for the demo preset: every value it shows."""
    from webapp.dashboard.forms import RunForm
    from webapp.runs.presets import preset_config

    form = RunForm(config=preset_config("demo", settings.REGIONS))
    data = {"name": "from the form", "mode": "decoupled"}
    for name in form.fields:
        value = form[name].value()
        if value is True:
            data[name] = "on"
        elif value is not None and value is not False and name not in data:
            data[name] = str(value)
    for n, row in enumerate(form.island_rows):
        for key, value in row["values"].items():
            data[f"islands-{n}-{key}"] = str(value)
    return data


@pytest.fixture
def manager(tmp_path):
    """A manager of the one-command start's processes; what it started stops with the test."""
    manager = ProcessManager(tmp_path / "logs", cwd=tmp_path)
    yield manager
    manager.stop_all(timeout=2)


@pytest.fixture
def running(redis_url, enqueued, operator) -> Run:
    """A run of three islands an operator created and started, on the tests' own Redis;
    the island tasks its start sent are cleared from `enqueued`."""
    from webapp.runs.lifecycle import create_run, start_run

    run = create_run(name="running", mode="decoupled", config=THREE_ISLANDS, user=operator)
    start_run(run, operator)
    enqueued.clear()
    return run


@pytest.fixture
def system(tmp_path):
    """A whole system of its own (tests/system/whole_system.py), its database migrated
    and a corpus for its tiny run at tmp_path/corpus.txt; it stops with the test.

    The tests make their tiny run named "demo" in the system's database, so that the
    start makes no demo of its own and the run finishes in a minute or two."""
    from tests.system.whole_system import ROOT, System  # it waits with wait_until

    system = System(tmp_path)
    (tmp_path / "corpus.txt").write_text("".join(
        f"line {i}: the islands train and the merge goes on.\n" for i in range(4000)))
    subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT,
                   env=system.env, check=True, timeout=300)
    yield system
    system.stop()
