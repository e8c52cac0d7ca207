"""Signing in to the API: sessions need CSRF for unsafe methods, bearer tokens do not;
bad tokens and inactive users get nothing; the docs and the schema need a login."""

import pytest
from django.conf import settings
from django.test import Client

from webapp.runs.api_token import ApiToken
from webapp.runs.models import Run

pytestmark = pytest.mark.django_db

NEW_RUN = {"name": "r", "mode": "decoupled", "config": {}}


def csrf_client(user) -> Client:
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    return client


def test_a_session_post_without_the_csrf_token_is_refused(api_for, operator):
    api = api_for()
    api.client = csrf_client(operator)

    response = api.post("/api/runs", NEW_RUN)

    assert response.status_code == 403
    [message] = response.json()["errors"]["csrf"]
    assert "X-CSRFToken" in message
    assert not Run.objects.exists()


def test_a_session_post_with_the_csrf_token_is_accepted(api_for, operator, redis_url):
    api = api_for()
    api.client = csrf_client(operator)
    api.client.get("/accounts/login/")  # the login form sets the CSRF cookie
    token = api.client.cookies[settings.CSRF_COOKIE_NAME].value

    response = api.post("/api/runs", NEW_RUN, HTTP_X_CSRFTOKEN=token)

    assert response.status_code == 201


@pytest.mark.parametrize("method, path", [
    ("PATCH", "/api/runs/1"), ("DELETE", "/api/runs/1"), ("POST", "/api/runs/1/start"),
    ("POST", "/api/tokens"), ("DELETE", "/api/tokens/1"),
])
def test_every_unsafe_method_needs_the_csrf_token_in_a_session(api_for, operator, method,
                                                                path):
    api = api_for()
    api.client = csrf_client(operator)

    response = api.call(method, path, {})

    assert response.status_code == 403
    assert "csrf" in response.json()["errors"]


def test_a_session_get_needs_no_csrf_token(operator):
    response = csrf_client(operator).get("/api/runs")

    assert response.status_code == 200


def test_an_anonymous_post_is_401_not_a_csrf_failure():
    response = Client(enforce_csrf_checks=True).post("/api/runs", NEW_RUN,
                                                     content_type="application/json")

    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")


def test_a_bearer_token_needs_no_csrf_token(operator, token_for, redis_url):
    client = Client(enforce_csrf_checks=True)

    response = client.post("/api/runs", NEW_RUN, content_type="application/json",
                           **token_for(operator))

    assert response.status_code == 201


def test_a_token_records_when_it_was_last_used(viewer, token_for):
    client = Client()
    client.get("/api/runs", **token_for(viewer))

    assert ApiToken.objects.get(user=viewer).last_used_at is not None


@pytest.mark.parametrize("header", [
    "Bearer arch_not-a-real-token",
    "Bearer ",
    "Token arch_whatever",
    "Basic b3R0bzpzZWNyZXQ=",
    "Bearer " + "x" * 300,
])
def test_a_bad_authorization_header_is_401(header):
    response = Client().get("/api/runs", HTTP_AUTHORIZATION=header)

    assert response.status_code == 401
    assert list(response.json()["errors"]) == ["auth"]


def test_a_token_of_an_inactive_user_is_401(viewer, token_for):
    headers = token_for(viewer)
    viewer.is_active = False
    viewer.save()

    assert Client().get("/api/runs", **headers).status_code == 401


def test_a_revoked_token_stops_working(viewer, token_for):
    headers = token_for(viewer)
    ApiToken.objects.filter(user=viewer).delete()

    assert Client().get("/api/runs", **headers).status_code == 401


def test_a_viewers_token_may_not_do_what_a_viewer_may_not(viewer, token_for):
    response = Client().post("/api/runs", NEW_RUN, content_type="application/json",
                             **token_for(viewer))

    assert response.status_code == 403
    assert response.json() == {"errors": {"permission": ["Creating runs is for operators."]}}


def test_permission_is_checked_before_the_body(viewer_api):
    response = viewer_api.post("/api/runs", {"no": "such field"})

    assert response.status_code == 403


def test_the_openapi_schema_needs_a_login(client):
    response = client.get("/api/openapi.json")

    assert response.status_code == 401
    assert list(response.json()["errors"]) == ["auth"]


def test_the_openapi_schema_describes_the_endpoints(viewer_api, viewer, token_for):
    by_session = viewer_api.get("/api/openapi.json")
    by_token = Client().get("/api/openapi.json", **token_for(viewer))

    assert by_session.status_code == by_token.status_code == 200
    paths = by_session.json()["paths"]
    assert {"/api/runs", "/api/runs/{run_id}", "/api/runs/{run_id}/islands/{name}/faults",
            "/api/runs/{run_id}/checkpoints/{checkpoint_id}/sample", "/api/system/faults",
            "/api/tokens", "/api/config/schema"} <= set(paths)
    schemas = by_session.json()["components"]["schemas"]
    assert schemas["IslandFault"]["properties"]["kind"]["enum"] == [
        "kill", "straggle", "partition", "degrade", "corrupt"]


def test_the_docs_send_anonymous_browsers_to_the_login_form(client):
    response = client.get("/api/docs")

    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/?next=/api/docs")


def test_the_docs_are_shown_to_signed_in_users(viewer_api):
    response = viewer_api.get("/api/docs")

    assert response.status_code == 200
    assert b"/api/openapi.json" in response.content
    assert b'data-api-csrf="true"' in response.content  # "Try it out" works with the session
    assert b"/static/ninja/swagger-ui-bundle.js" in response.content  # served here, no CDN
    assert b"cdn." not in response.content
