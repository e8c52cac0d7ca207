"""The API's front (webapp.api.api): what it answers to a request body it cannot take
(not JSON, not an object, empty, nested too deep, too large; the run is never
created)."""

import json

import pytest
from django.conf import settings

from webapp.api.api import MAX_BODY_BYTES
from webapp.runs.models import Run

pytestmark = pytest.mark.django_db

RUNS = "/api/runs"


def test_it_answers_400_to_malformed_json(operator_api):
    response = operator_api.client.post(RUNS, '{"name": ', content_type="application/json")

    assert response.status_code == 400
    assert response.json()["errors"]["body"][0].startswith("Not valid JSON")


@pytest.mark.parametrize("body, got", [('["a list"]', "an array"), ('"a string"', "a string"),
                                       ("null", "null"), ("4", "a number")])
def test_it_answers_400_to_a_body_that_is_not_an_object(operator_api, body, got):
    response = operator_api.client.post(RUNS, body, content_type="application/json")

    assert response.status_code == 400
    assert response.json() == {"errors": {"body": [f"Must be a JSON object, got {got}."]}}


def test_it_answers_422_to_an_empty_body(operator_api):
    response = operator_api.client.post(RUNS, "", content_type="application/json")

    assert response.status_code == 422
    assert response.json() == {"errors": {"body": ["Send a JSON object."]}}


def test_it_answers_400_to_json_nested_too_deep(operator_api):
    body = "[" * 100_000 + "]" * 100_000

    response = operator_api.client.post(RUNS, body, content_type="application/json")

    assert response.status_code == 400


def test_it_answers_413_to_a_body_over_one_mebibyte(operator_api):
    body = {"name": "r", "mode": "decoupled", "config": {"data": {"path": "x" * MAX_BODY_BYTES}}}

    response = operator_api.post(RUNS, body)

    assert response.status_code == 413
    assert response.json() == {"errors": {"body": [
        f"The body is larger than the limit of {MAX_BODY_BYTES} bytes."]}}
    assert not Run.objects.exists()


def test_it_answers_413_to_a_body_over_djangos_own_limit(operator_api):
    body = json.dumps({"name": "x" * (settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 1)})

    response = operator_api.client.post(RUNS, body, content_type="application/json")

    assert response.status_code == 413
    assert "body" in response.json()["errors"]


def test_it_refuses_other_methods(operator_api):
    assert operator_api.client.put(RUNS).status_code == 405


def test_the_api_refuses_a_body_over_its_limit_before_reading_it(operator_token_api):
    response = operator_token_api.client.post(
        "/api/runs", b"{" + b" " * MAX_BODY_BYTES + b"}", content_type="application/json",
        **operator_token_api.headers)

    assert response.status_code == 413
    assert "larger than the limit" in response.json()["errors"]["body"][0]
