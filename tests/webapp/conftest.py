"""Fixtures of the web app's tests: users and clients.

A viewer may look, an operator may create.

The users have no password (hashing one takes a third of a second); clients log in
with force_login.
"""

import pytest
from django.contrib.auth.models import Permission
from django.test import Client


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




@pytest.fixture
def enqueued(monkeypatch):
    """Island tasks the services send, recorded instead of going to a broker."""
    from trainer.tasks import run_island

    sent: list[dict] = []

    def apply_async(args=None, kwargs=None, **options):
        sent.append({"args": list(args or []), **options})

    monkeypatch.setattr(run_island, "apply_async", apply_async)
    return sent
