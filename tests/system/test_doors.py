"""The doors of the web app: every page, form and websocket for anonymous, viewer,
operator and admin; a token of another user; CSRF on every form; and secrets that never
show. (The API has its own matrix: tests/webapp/api/test_authorization.py; the limit on
failed sign-ins is tests/webapp/dashboard/test_login.py's.)
"""

from __future__ import annotations

import re

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from django.test import Client

from webapp.asgi import application
from webapp.dashboard.consumers import UNAUTHORIZED
from webapp.runs.api_token import ApiToken
from webapp.runs.lifecycle import create_run
from webapp.runs.models import Run, Simulation

pytestmark = pytest.mark.django_db

ROLES = ("anonymous", "viewer", "operator", "admin")
TWO_ISLANDS = {"islands": [{"name": "a", "region": "us-east"},
                           {"name": "b", "region": "us-east"}]}


@pytest.fixture
def client_for(request):
    """A client signed in as the role's user (a fresh anonymous one for "anonymous")."""

    def make(role: str, **kwargs) -> Client:
        client = Client(**kwargs)
        if role != "anonymous":
            client.force_login(request.getfixturevalue(role))
        return client

    return make


def bearer(user) -> dict[str, str]:
    return {"HTTP_AUTHORIZATION": f"Bearer {ApiToken.issue(user, 'doors')[1]}"}


@pytest.fixture
def run(redis_url) -> Run:
    return create_run(name="doors", mode="decoupled", config=TWO_ISLANDS, user=None)


@pytest.fixture(autouse=True)
def _regions_and_queues(settings, monkeypatch):
    settings.REGIONS = ["us-east", "us-west"]
    from webapp.runs.tasks import run_simulation

    monkeypatch.setattr(run_simulation, "apply_async", lambda *args, **kwargs: None)


def signed_in_only(role: str, ok: int = 200) -> int:
    return 302 if role == "anonymous" else ok


# (path, who gets what: role -> status)
PAGES = [
    ("/", {r: signed_in_only(r) for r in ROLES}),
    ("/runs/new/", {"anonymous": 302, "viewer": 403, "operator": 200, "admin": 200}),
    ("/runs/{run}/", {r: signed_in_only(r) for r in ROLES}),
    ("/compare/", {r: signed_in_only(r) for r in ROLES}),
    ("/simulate/", {r: signed_in_only(r) for r in ROLES}),
    ("/account/tokens/", {r: signed_in_only(r) for r in ROLES}),
    ("/api/docs", {r: signed_in_only(r) for r in ROLES}),
    # Django's admin: staff only; everyone else is sent to its sign-in page.
    ("/admin/", {"anonymous": 302, "viewer": 302, "operator": 302, "admin": 200}),
    ("/metrics", {"anonymous": 401, "viewer": 403, "operator": 200, "admin": 200}),
    ("/accounts/login/", dict.fromkeys(ROLES, 200)),
]


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("path, expected", PAGES, ids=[p for p, _ in PAGES])
def test_every_page_answers_each_role_as_its_role_allows(role, path, expected, client_for,
                                                         run):
    response = client_for(role).get(path.format(run=run.pk))

    assert response.status_code == expected[role]
    if response.status_code == 302:
        assert "login" in response["Location"]


def forms(new_run: dict, viewer_token: int) -> list[tuple[str, dict]]:
    """Every form the pages post, with valid values."""
    return [
        ("/runs/new/", new_run),
        ("/simulate/", {"chips": "150000", "islands": "1", "hours": "1"}),
        ("/account/tokens/", {"name": "from the form"}),
        (f"/account/tokens/{viewer_token}/revoke/", {}),
    ]


# path -> role -> status of a valid post
POSTS = {
    "/runs/new/": {"anonymous": 302, "viewer": 403, "operator": 302, "admin": 302},
    "/simulate/": {"anonymous": 302, "viewer": 403, "operator": 302, "admin": 302},
    "/account/tokens/": {"anonymous": 302, "viewer": 200, "operator": 200, "admin": 200},
    # The viewer's own token: revoked for the viewer, not found for anyone else.
    "revoke": {"anonymous": 302, "viewer": 302, "operator": 404, "admin": 404},
}


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("index", range(4), ids=list(POSTS))
def test_every_form_answers_each_role_as_its_role_allows_and_saves_only_then(
        role, index, client_for, run, viewer, new_run_form):
    token, _ = ApiToken.issue(viewer, "the viewer's")
    path, data = forms(new_run_form, token.pk)[index]
    expected = POSTS[list(POSTS)[index]][role]
    counts = (Run.objects.count(), Simulation.objects.count(), ApiToken.objects.count())

    response = client_for(role).post(path, data)

    assert response.status_code == expected, response.content[:300]
    after = (Run.objects.count(), Simulation.objects.count(), ApiToken.objects.count())
    refused = expected in (403, 404) or (expected == 302 and role == "anonymous")
    if refused:
        assert after == counts
        if response.status_code == 302:
            assert "login" in response["Location"]
    else:
        assert after != counts


@pytest.mark.parametrize("index", range(4), ids=list(POSTS))
def test_every_form_refuses_a_post_without_the_csrf_token(index, client_for, run, viewer,
                                                           new_run_form):
    token, _ = ApiToken.issue(viewer, "the viewer's")
    path, data = forms(new_run_form, token.pk)[index]
    role = "viewer" if "token" in path else "operator"
    counts = (Run.objects.count(), Simulation.objects.count(), ApiToken.objects.count())

    response = client_for(role, enforce_csrf_checks=True).post(path, data)

    assert response.status_code == 403
    assert b"CSRF" in response.content
    assert (Run.objects.count(), Simulation.objects.count(),
            ApiToken.objects.count()) == counts


def test_the_sign_in_form_refuses_a_post_without_the_csrf_token(django_user_model):
    django_user_model.objects.create_user("sam", password="a right password 9")

    response = Client(enforce_csrf_checks=True).post(
        "/accounts/login/", {"username": "sam", "password": "a right password 9"})

    assert response.status_code == 403
    assert "_auth_user_id" not in Client().session


def test_a_token_of_another_user_cannot_revoke_or_list_someone_elses_tokens(
        viewer, operator):
    theirs, _ = ApiToken.issue(viewer, "the viewer's")
    headers = bearer(operator)

    listed = Client().get("/api/tokens", **headers)
    revoked = Client().delete(f"/api/tokens/{theirs.pk}", **headers)

    assert theirs.pk not in [t["id"] for t in listed.json()["tokens"]]
    assert revoked.status_code == 404
    assert ApiToken.objects.filter(pk=theirs.pk).exists()


def test_a_revoked_or_made_up_token_signs_nobody_in(viewer):
    row, token = ApiToken.issue(viewer, "soon gone")
    row.delete()

    for header in (f"Bearer {token}", "Bearer arch_made-up", "Basic dmVyYTp4"):
        response = Client().get("/api/runs", HTTP_AUTHORIZATION=header)
        assert response.status_code == 401


# -- websockets -----------------------------------------------------------------------

def connect(path: str, cookies: str = "") -> tuple[bool, int | None]:
    """Open a websocket on the whole ASGI app (origin check, session, routing)."""
    headers = [(b"origin", b"http://localhost"), (b"host", b"localhost")]
    if cookies:
        headers.append((b"cookie", cookies.encode()))

    async def attempt() -> tuple[bool, int | None]:
        com = WebsocketCommunicator(application, path, headers=headers)
        connected, code = await com.connect(timeout=5)
        await com.disconnect()
        return connected, code

    return async_to_sync(attempt)()


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("path", ["/ws/runs/", "/ws/runs/{run}/", "/ws/simulations/{sim}/"])
def test_every_websocket_takes_signed_in_users_only(role, path, client_for, run,
                                                    channel_layer, operator):
    simulation = Simulation.objects.create(spec={"chips": [150000]}, created_by=operator)
    client = client_for(role)
    cookies = "; ".join(f"{k}={v.value}" for k, v in client.cookies.items())

    connected, code = connect(path.format(run=run.pk, sim=simulation.pk), cookies)

    if role == "anonymous":
        assert not connected and code == UNAUTHORIZED
    else:
        assert connected


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_a_websocket_from_another_origin_is_refused(client_for, run, channel_layer):
    client = client_for("viewer")
    cookies = "; ".join(f"{k}={v.value}" for k, v in client.cookies.items())

    async def attempt() -> bool:
        com = WebsocketCommunicator(application, "/ws/runs/", headers=[
            (b"origin", b"https://evil.example"), (b"cookie", cookies.encode())])
        connected, _ = await com.connect(timeout=5)
        await com.disconnect()
        return connected

    assert not async_to_sync(attempt)()


# -- secrets --------------------------------------------------------------------------

class Api:
    """GET with a bearer token."""

    def __init__(self, headers: dict[str, str]):
        self.headers = headers

    def get(self, path: str):
        return Client().get(path, **self.headers)


def test_the_run_secret_and_secret_key_never_show_in_pages_api_or_metrics(
        run, admin, admin_client, settings):
    metrics_token = settings.METRICS_TOKEN = "scrape-me-" + "x" * 30
    secrets = [run.secret, settings.SECRET_KEY, metrics_token]
    api = Api(bearer(admin))
    answers = [
        admin_client.get("/").content, admin_client.get(f"/runs/{run.pk}/").content,
        admin_client.get(f"/admin/runs/run/{run.pk}/change/").content,
        admin_client.get("/admin/runs/run/").content,
        api.get("/api/runs").content, api.get(f"/api/runs/{run.pk}").content,
        api.get("/api/config/schema").content, api.get("/api/openapi.json").content,
        Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {metrics_token}").content,
    ]

    for answer in answers:
        for secret in secrets:
            assert secret.encode() not in answer


def test_a_redis_password_never_shows_in_pages_or_api(admin_client, admin, settings):
    settings.REDIS_URL = "redis://:a-redis-password-xyz@127.0.0.1:1/0"
    api = Api(bearer(admin))

    answers = [admin_client.get("/").content, admin_client.get("/simulate/").content,
               api.get("/api/config/schema").content, api.get("/api/runs").content]

    assert all(b"a-redis-password-xyz" not in answer for answer in answers)


@pytest.mark.integration
def test_syncd_never_logs_the_run_secret_when_it_rejects_updates(run, redis_url, tmp_path,
                                                                 caplog):
    from diloco.protocol import encode_message
    from syncd.connection import connect as connect_redis
    from syncd.service import RunSync
    from syncd.store import RunStore
    from webapp.runs.records import DatabaseRecorder

    store = RunStore(connect_redis(redis_url), run.pk)
    store.put_spec(run.mode, run.config, run.secret)
    store.set_epoch("a", 1)
    sync = RunSync(store, DatabaseRecorder(run.pk), tmp_path, clock=lambda: 1000.0,
                   control_every_s=0.0)
    meta = {"run": run.pk, "island": "a", "epoch": 1, "fragment": 0, "base_version": 0,
            "seq": 4, "tokens": 1, "inner_steps": 4, "compute_s": 1.0, "codec": "none"}
    forged = encode_message("update", meta, {}, b"forged".ljust(32, b"!"))
    store.updates.push_update("a", 1, 0, 4, forged)
    store.updates.push_update("a", 1, 0, 8, b"\x00" * 100)

    with caplog.at_level("DEBUG"):
        sync.tick()

    assert "quarantined" in caplog.text
    assert run.secret not in caplog.text
    assert not re.search(bytes.fromhex(run.secret).hex(), caplog.text)
