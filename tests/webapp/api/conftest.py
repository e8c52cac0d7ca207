"""Fixtures of the API tests: clients for each role (by session or bearer token), runs
in each state on the tests' own Redis (the running one from tests/fixtures.py), a real
checkpoint of a run's model, and Django's WSGI handler for schemathesis."""

import json

import pytest
from django.core import signals
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from django.test import Client

from diloco.island import initial_model
from syncd.checkpoint import save
from tests.fixtures import running  # noqa: F401 - a fixture, found by name
from tests.webapp.runs.three_islands import THREE_ISLANDS
from webapp.runs.api_token import ApiToken
from webapp.runs.lifecycle import create_run, pause_run, start_run
from webapp.runs.models import Checkpoint, Run


class Api:
    """A test client that speaks JSON, signed in one way or another."""

    def __init__(self, client: Client, **headers: str):
        self.client = client
        self.headers = headers

    def call(self, method: str, path: str, body=None, **extra):
        data = json.dumps(body) if body is not None else None
        kwargs = {"content_type": "application/json"} if data is not None else {}
        return getattr(self.client, method.lower())(path, data, **kwargs, **self.headers,
                                                    **extra)

    def get(self, path: str, **query):
        return self.client.get(path, query, **self.headers)

    def post(self, path: str, body=None, **extra):
        return self.call("POST", path, body, **extra)

    def patch(self, path: str, body=None):
        return self.call("PATCH", path, body)

    def delete(self, path: str):
        return self.call("DELETE", path)


def bearer(user) -> dict[str, str]:
    _, token = ApiToken.issue(user, "tests")
    return {"HTTP_AUTHORIZATION": f"Bearer {token}"}


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture(autouse=True)
def _regions(settings):
    settings.REGIONS = ["us-east", "us-central", "us-west", "us-south"]


@pytest.fixture
def anonymous_api() -> Api:
    return Api(Client())


@pytest.fixture
def viewer_api(viewer) -> Api:
    return Api(logged_in(viewer))


@pytest.fixture
def operator_api(operator) -> Api:
    return Api(logged_in(operator))


@pytest.fixture
def admin_api(admin) -> Api:
    return Api(logged_in(admin))


@pytest.fixture
def operator_token_api(operator) -> Api:
    return Api(Client(), **bearer(operator))


@pytest.fixture
def viewer_token_api(viewer) -> Api:
    return Api(Client(), **bearer(viewer))


@pytest.fixture
def draft(redis_url) -> Run:
    return create_run(name="draft", mode="decoupled", config=THREE_ISLANDS, user=None)


@pytest.fixture
def paused(redis_url, enqueued) -> Run:
    run = create_run(name="paused", mode="elastic", config=THREE_ISLANDS, user=None)
    start_run(run, None)
    pause_run(run, None)
    return run


@pytest.fixture
def checkpoint(running, tmp_path) -> Checkpoint:  # noqa: F811 - the fixture imported
    """A real checkpoint of the running run's initial model."""
    params = initial_model(running.run_config()).state_dict()
    path = tmp_path / "checkpoint.safetensors"
    sha256, size = save(path, params, {}, [3, 4], 1024)
    return Checkpoint.objects.create(run=running, versions={"0": 3, "1": 4}, outer_step=3,
                                     path=str(path), sha256=sha256, bytes=size)


@pytest.fixture
def metrics_token(settings) -> str:
    settings.METRICS_TOKEN = "scrape-me-" + "x" * 30
    return settings.METRICS_TOKEN


@pytest.fixture
def token_for():
    """The Authorization header of a new bearer token of a user."""
    return bearer


@pytest.fixture
def api_for():
    """An Api signed in as a user by session (or anonymous for None)."""
    return lambda user=None, **headers: Api(logged_in(user) if user else Client(), **headers)


@pytest.fixture
def wsgi_app(settings):
    """Django's WSGI handler, keeping the test's database connection between requests
    (as django.test.Client does: a request's end must not close the connection inside
    the test's transaction). Schemathesis sends its requests to localhost."""
    settings.ALLOWED_HOSTS = ["localhost"]
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    try:
        yield get_wsgi_application()
    finally:
        signals.request_started.connect(close_old_connections)
        signals.request_finished.connect(close_old_connections)
