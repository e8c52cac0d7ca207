"""The API's views outside the NinjaAPI (webapp.api.views): a 404 for a path under /api/
that names no endpoint, and the CSRF failure in the API's error format. (Named
test_api_views.py: the dashboard's test_views.py runs in the same tier.)"""

import json

import pytest
from django.test import Client, RequestFactory
from django.urls import resolve

from webapp.api.views import csrf_failure

pytestmark = pytest.mark.django_db


def test_a_path_under_api_that_names_no_endpoint_is_a_404_in_the_apis_format():
    response = Client().get("/api/nowhere")

    assert response.status_code == 404
    assert response["Content-Type"].startswith("application/json")
    assert response.json() == {"errors": {"path": [
        "No API endpoint at /api/nowhere. The endpoints are listed at /api/docs."]}}


def test_a_trailing_slash_is_pointed_out_as_the_likely_mistake():
    message = Client().get("/api/runs/").json()["errors"]["path"][0]

    assert "API paths have no trailing slash: /api/runs." in message


def request_to(path: str):
    request = RequestFactory().post(path)
    request.resolver_match = resolve(path)
    return request


def test_a_csrf_failure_in_the_api_says_how_to_pass_the_check_as_json():
    response = csrf_failure(request_to("/api/runs"), "CSRF token missing.")

    assert response.status_code == 403
    [message] = json.loads(response.content)["errors"]["csrf"]
    assert message.startswith("CSRF check failed (CSRF token missing.).")
    assert "X-CSRFToken" in message and "Authorization: Bearer" in message


def test_a_csrf_failure_elsewhere_is_djangos_own_page():
    response = csrf_failure(request_to("/runs/new/"), "CSRF token missing.")

    assert response.status_code == 403
    assert not response["Content-Type"].startswith("application/json")
