"""Fixtures of the web app's tests: users and clients.

A viewer may look; an operator (a member of the "operators" group) may create, run,
break and heal runs; an admin (a superuser) may do everything.

The users have no password (hashing one takes a third of a second); clients log in
with force_login.
"""

import pytest
from django.test import Client

from webapp.runs.roles import operators_group


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
    from trainer.tasks import run_island

    sent: list[dict] = []

    def apply_async(args=None, kwargs=None, **options):
        sent.append({"args": list(args or []), **options})

    monkeypatch.setattr(run_island, "apply_async", apply_async)
    return sent
