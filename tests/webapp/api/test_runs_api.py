import json

import pytest
from django.conf import settings
from django.test import Client

from trainer.config import field_help
from webapp.api.views import MAX_BODY_BYTES
from webapp.runs.models import Run
from webapp.runs.services import create_run

pytestmark = pytest.mark.django_db

RUNS = "/api/runs/"


def post_json(client: Client, body, **extra):
    return client.post(RUNS, json.dumps(body), content_type="application/json", **extra)


def test_it_answers_401_in_json_to_anonymous_readers(client):
    response = client.get(RUNS)

    assert response.status_code == 401
    assert "auth" in response.json()["errors"]


def test_it_answers_401_to_anonymous_writers(client):
    response = post_json(client, {"name": "r", "mode": "decoupled", "config": {}})

    assert response.status_code == 401
    assert not Run.objects.exists()


def test_it_lists_runs_without_their_secrets(viewer_client):
    run = create_run(name="listed", mode="decoupled", config={}, user=None)

    response = viewer_client.get(RUNS)

    assert response.status_code == 200
    [listed] = response.json()["runs"]
    assert (listed["id"], listed["name"], listed["state"]) == (run.pk, "listed", "draft")
    assert len(listed["islands"]) == 2
    assert run.secret not in response.content.decode()


def test_it_creates_a_run(operator_client, operator):
    body = {"name": "api run", "mode": "elastic", "config": {"sync": {"min_quorum": 1}}}

    response = post_json(operator_client, body)

    assert response.status_code == 201
    data = response.json()
    run = Run.objects.get()
    assert data["id"] == run.pk
    assert response["Location"] == f"/api/runs/{run.pk}/"
    assert (data["name"], data["mode"], data["state"]) == ("api run", "elastic", "draft")
    assert data["config"]["sync"]["min_quorum"] == 1
    assert [i["name"] for i in data["islands"]] == ["island-0", "island-1"]
    assert "secret" not in data
    assert run.created_by == operator


def test_it_rejects_min_quorum_above_island_count_keyed_by_dotted_path(operator_client):
    body = {"name": "r", "mode": "decoupled", "config": {"sync": {"min_quorum": 6}}}

    response = post_json(operator_client, body)

    assert response.status_code == 422
    assert response.json() == {"errors": {"sync.min_quorum": [
        "Must be between 1 and the number of islands (2), got 6."]}}
    assert not Run.objects.exists()


def test_it_reports_name_and_mode_errors_beside_config_errors(operator_client):
    body = {"name": "", "mode": "x", "config": {"islands": [{"name": "a", "region": "mars"}]}}

    response = post_json(operator_client, body)

    assert response.status_code == 422
    assert set(response.json()["errors"]) == {"name", "mode", "islands.0.region",
                                              "sync.min_quorum"}


def test_it_answers_400_to_malformed_json(operator_client):
    response = operator_client.post(RUNS, '{"name": ', content_type="application/json")

    assert response.status_code == 400
    assert response.json()["errors"]["body"][0].startswith("Not valid JSON")


@pytest.mark.parametrize("body", ['["a list"]', '"a string"', "null"])
def test_it_answers_400_to_a_body_that_is_not_an_object(operator_client, body):
    response = operator_client.post(RUNS, body, content_type="application/json")

    assert response.status_code == 400
    assert "Must be a JSON object" in response.json()["errors"]["body"][0]


def test_it_answers_400_to_a_config_put_at_the_top_level(operator_client):
    response = post_json(operator_client, {"name": "r", "mode": "decoupled", "sync": {}})

    assert response.status_code == 400
    assert "'sync'" in response.json()["errors"]["body"][0]


def test_it_answers_400_to_json_nested_too_deep(operator_client):
    body = "[" * 100_000 + "]" * 100_000

    response = operator_client.post(RUNS, body, content_type="application/json")

    assert response.status_code == 400


def test_it_answers_413_to_a_body_over_one_mebibyte(operator_client):
    body = json.dumps({"name": "r", "mode": "decoupled", "config": {"data": {
        "path": "x" * MAX_BODY_BYTES}}})

    response = operator_client.post(RUNS, body, content_type="application/json")

    assert response.status_code == 413
    assert str(MAX_BODY_BYTES) in response.json()["errors"]["body"][0]
    assert not Run.objects.exists()


def test_it_forbids_viewers_to_create_runs(viewer_client):
    response = post_json(viewer_client, {"name": "r", "mode": "decoupled", "config": {}})

    assert response.status_code == 403
    assert "runs.add_run" in response.json()["errors"]["permission"][0]
    assert not Run.objects.exists()


def test_it_enforces_csrf_on_post(operator):
    client = Client(enforce_csrf_checks=True)
    client.force_login(operator)
    body = {"name": "r", "mode": "decoupled", "config": {}}

    refused = post_json(client, body)
    client.get("/accounts/login/")  # the login form sets the CSRF cookie
    token = client.cookies[settings.CSRF_COOKIE_NAME].value
    accepted = post_json(client, body, HTTP_X_CSRFTOKEN=token)

    assert refused.status_code == 403
    assert "csrf" in refused.json()["errors"]
    assert accepted.status_code == 201


def test_it_refuses_other_methods(operator_client):
    assert operator_client.delete(RUNS).status_code == 405


def test_it_shows_one_run(viewer_client):
    run = create_run(name="one", mode="decoupled", config={}, user=None)

    response = viewer_client.get(f"/api/runs/{run.pk}/")

    assert response.status_code == 200
    assert response.json()["name"] == "one"
    assert "secret" not in response.json()


def test_it_answers_404_in_json_for_a_missing_run(viewer_client):
    response = viewer_client.get("/api/runs/999999/")

    assert response.status_code == 404
    assert response.json() == {"errors": {"run": ["No run with id 999999."]}}


def test_the_schema_gives_defaults_and_help(viewer_client):
    response = viewer_client.get("/api/config/schema/")

    assert response.status_code == 200
    data = response.json()
    assert data["defaults"]["sync"]["min_quorum"] == 2
    assert data["help"] == field_help()
    assert data["modes"] == ["decoupled", "elastic"]
    assert data["regions"] == settings.REGIONS


def test_the_schema_needs_a_login(client):
    assert client.get("/api/config/schema/").status_code == 401
