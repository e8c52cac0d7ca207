"""API tokens: made in the API (shown once; `manage.py create_api_token` has
tests/webapp/runs/management/commands/test_create_api_token.py), listed by hint,
revoked by their owner only."""


import pytest
from django.test import Client

from webapp.runs.api_token import ApiToken

pytestmark = pytest.mark.django_db


def test_a_user_can_make_a_token_that_is_shown_once(viewer_api, viewer):
    response = viewer_api.post("/api/tokens", {"name": "laptop"})

    assert response.status_code == 201
    data = response.json()
    assert data["token"].startswith("arch_")
    assert (data["name"], data["hint"]) == ("laptop", data["token"][:12])
    assert ApiToken.authenticate(data["token"]) == viewer
    listed = viewer_api.get("/api/tokens").json()["tokens"]
    assert [t["id"] for t in listed] == [data["id"]]
    assert "token" not in listed[0]
    assert data["token"] not in viewer_api.get("/api/tokens").content.decode()


def test_a_token_made_in_the_api_works_as_a_bearer_token(viewer_api):
    token = viewer_api.post("/api/tokens", {}).json()["token"]

    response = Client().get("/api/runs", HTTP_AUTHORIZATION=f"Bearer {token}")

    assert response.status_code == 200


def test_a_token_name_is_at_most_100_characters(viewer_api):
    response = viewer_api.post("/api/tokens", {"name": "n" * 101})

    assert response.status_code == 422
    assert list(response.json()["errors"]) == ["name"]


def test_the_list_shows_only_ones_own_tokens(viewer_api, viewer, operator):
    ApiToken.issue(operator, "theirs")
    mine, _ = ApiToken.issue(viewer, "mine")

    listed = viewer_api.get("/api/tokens").json()["tokens"]

    assert [t["id"] for t in listed] == [mine.pk]


def test_a_user_can_revoke_a_token_of_their_own(viewer_api, viewer):
    row, token = ApiToken.issue(viewer, "old")

    response = viewer_api.delete(f"/api/tokens/{row.pk}")

    assert response.status_code == 204
    assert ApiToken.authenticate(token) is None


def test_nobody_can_revoke_another_users_token(api_for, token_for, viewer, operator, admin):
    row, token = ApiToken.issue(viewer, "vera's")

    by_token = api_for(None, **token_for(operator)).delete(f"/api/tokens/{row.pk}")
    by_admin = api_for(admin).delete(f"/api/tokens/{row.pk}")

    assert by_token.status_code == by_admin.status_code == 404
    assert by_token.json() == {"errors": {"token": [f"You have no token with id {row.pk}."]}}
    assert ApiToken.authenticate(token) == viewer
