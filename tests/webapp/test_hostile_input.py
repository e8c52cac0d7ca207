"""Limits on what the web app takes, each refused with a clear message: request bodies
and form posts, config values (model size, island count, text lengths), prompts; and
a run's data.path, which must stay inside the configured data folders.
"""

from __future__ import annotations

import json

import pytest
from django.test import Client

from diloco.config import MAX_ISLANDS, MAX_PARAMS
from diloco.config_parse import ConfigError, parse_config
from webapp.runs.api_token import ApiToken
from webapp.runs.lifecycle import create_run
from webapp.runs.models import RUN_NAME_MAX_LENGTH, Run

pytestmark = pytest.mark.django_db

REGIONS = ["us-east", "us-west"]


@pytest.fixture(autouse=True)
def _regions(settings):
    settings.REGIONS = REGIONS


def post_json(client: Client, path: str, body, **headers):
    return client.post(path, json.dumps(body), content_type="application/json", **headers)


@pytest.fixture
def operator_token(operator) -> dict[str, str]:
    return {"HTTP_AUTHORIZATION": f"Bearer {ApiToken.issue(operator, 'limits')[1]}"}


def errors_of_run(client: Client, headers: dict, **body) -> dict:
    response = post_json(client, "/api/runs",
                         {"name": "limits", "mode": "decoupled", **body}, **headers)
    assert response.status_code == 422, response.content[:300]
    return response.json()["errors"]


# -- sizes ----------------------------------------------------------------------------

def test_a_model_larger_than_the_bound_is_refused_with_its_parameter_count():
    with pytest.raises(ConfigError) as refused:
        parse_config({"model": {"n_layer": 48, "n_embd": 4096, "n_head": 64}}, REGIONS)

    [message] = refused.value.errors["model"]
    assert message.startswith("The model would have 9,666,830,336 parameters; at most "
                              f"{MAX_PARAMS:,} are allowed")


def test_the_largest_model_under_the_bound_is_accepted():
    config = parse_config({"model": {"n_layer": 24, "n_embd": 2048, "n_head": 16}}, REGIONS)

    assert config.model.n_embd == 2048


def test_the_api_refuses_too_large_a_model_and_too_many_islands(operator_token):
    client = Client()
    islands = [{"name": f"i{n}", "region": "us-east"} for n in range(MAX_ISLANDS + 1)]

    model = errors_of_run(client, operator_token,
                          config={"model": {"n_layer": 48, "n_embd": 4096, "n_head": 64}})
    many = errors_of_run(client, operator_token, config={"islands": islands})

    assert "parameters; at most" in model["model"][0]
    assert many["islands"] == [f"At most {MAX_ISLANDS} islands, got {MAX_ISLANDS + 1}."]


@pytest.mark.parametrize("body, key, words", [
    ({"name": "x" * (RUN_NAME_MAX_LENGTH + 1), "config": {}}, "name",
     f"Must be at most {RUN_NAME_MAX_LENGTH} characters"),
    ({"config": {"data": {"path": "x" * 1001}}}, "data.path", "at most 1000 characters"),
    ({"config": {"budget": {"total_tokens": 10**14}}}, "budget.total_tokens",
     "Must be between 1000 and 1e+13"),
    ({"config": {"seed": 10**400}}, "seed", "Must be between 0 and"),
])
def test_the_api_refuses_values_over_their_limits_with_a_message(body, key, words,
                                                                  operator_token):
    errors = errors_of_run(Client(), operator_token, **body)

    assert words in errors[key][0]


def test_the_api_refuses_a_token_name_over_100_characters(viewer):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {ApiToken.issue(viewer, 'x')[1]}"}

    response = post_json(Client(), "/api/tokens", {"name": "n" * 101}, **headers)

    assert response.status_code == 422
    assert list(response.json()["errors"]) == ["name"]


def test_a_form_post_over_djangos_limit_is_refused_not_a_server_error(operator_client,
                                                                      settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000

    response = operator_client.post("/runs/new/", {"name": "x" * 5000})

    assert response.status_code == 400
    assert not Run.objects.exists()


def test_a_form_post_with_too_many_fields_is_refused_not_a_server_error(operator_client,
                                                                        settings):
    too_many = settings.DATA_UPLOAD_MAX_NUMBER_FIELDS + 1
    fields = {f"islands-{n}-name": str(n) for n in range(too_many)}

    response = operator_client.post("/runs/new/", fields)

    assert response.status_code == 400
    assert not Run.objects.exists()


def test_the_new_run_form_takes_as_many_island_rows_as_a_run_may_have(settings):
    per_island = 7
    assert 60 + per_island * MAX_ISLANDS <= settings.DATA_UPLOAD_MAX_NUMBER_FIELDS


# -- data roots -----------------------------------------------------------------------

def test_a_run_a_user_creates_must_read_inside_the_data_roots(data_root, operator):
    escape = str(data_root / ".." / "secret.txt")

    with pytest.raises(ConfigError) as refused:
        create_run(name="escape", mode="decoupled", user=operator,
                   config={"data": {"path": escape}})
    inside = create_run(name="inside", mode="decoupled", user=operator,
                        config={"data": {"path": str(data_root / "corpus")}})

    assert list(refused.value.errors) == ["data.path"]
    assert inside.config["data"]["path"] == str(data_root / "corpus")
    assert Run.objects.count() == 1


def test_the_api_and_the_form_refuse_a_data_path_outside_the_roots(
        data_root, operator_token, operator_client, new_run_form):
    escape = str(data_root / ".." / "secret.txt")

    api = errors_of_run(Client(), operator_token, config={"data": {"path": escape}})
    form = operator_client.post("/runs/new/", {**new_run_form, "data.path": escape})

    assert "inside one of the data folders" in api["data.path"][0]
    assert form.status_code == 200
    assert "inside one of the data folders" in " ".join(form.context["form"].errors["data.path"])
    assert not Run.objects.exists()
