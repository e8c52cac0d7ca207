"""The OpenAPI schema (webapp/api/schemas.py). How it states a run config's fields:
tests/webapp/api/test_config_schema.py.

The schema says what the API accepts, on the operations whose bodies carry a run
config or a fault. Schemathesis draws bodies from /api/openapi.json that fit the schema
and bodies that do not, and sends them through the real Django app. A body that fits
must be taken, or refused only for a rule between fields that the schema names in its
descriptions (min_quorum against the islands, unique names, memory, ...); a body that
does not fit must be refused. Either failure is the "schema validation mismatch"
schemathesis reports when a schema and its API's validation disagree.
"""

import re
from collections import Counter

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from schemathesis.checks import negative_data_rejection
from schemathesis.core.failures import FailureGroup
from schemathesis.core.parameters import ParameterLocation
from schemathesis.generation.modes import GenerationMode

from webapp.runs.api_token import ApiToken

CASES = 120
OPERATIONS = [("POST", "/api/runs"), ("POST", "/api/runs/{run_id}/islands"),
              ("POST", "/api/runs/{run_id}/islands/{name}/faults")]
# What parse_config and the services say about a rule between fields, or about the
# deployment, which no field's bounds in the schema can state.
RELATIONS = re.compile("|".join((
    r"Must be between 1 and the number of islands",
    r"Must divide model\.n_embd",
    r"The model would have",
    r"Must be at most the number of the model's tensors",
    r"Must be at most sync\.inner_steps",
    r"Must be less than sync\.inner_steps",
    r"Must be at least model\.block_size",
    r"Island names must be unique",
    r"Must divide islands\.\d+\.batch_size",
    r"Redis would need",
    r"syncd would need",
    r"Island .* would need",
    r"The island host of .* would need",
    r"Must be a file or folder inside one of the data folders",
    r"Must be a path that can be resolved",
    r"Must be 1 with emulation\.link none",
    r"Must be the number of islands in mode sync",
    r"Must be 0 in mode sync",
    r"No folder at .*: give a folder holding config\.json",  # model.source hf's hf_config
    r"Must be bytes, train or a folder holding tokenizer\.json",  # data.tokenizer's folder
    r"The folder .* holds no tokenizer\.json",
)))


def refused_for_a_field(response) -> list[str]:
    """The messages of a 422 that are not about a rule between fields."""
    if response.status_code != 422:
        return []
    return [f"{key}: {message}" for key, messages in response.json()["errors"].items()
            for message in messages if not RELATIONS.match(message)]


@pytest.mark.django_db
@pytest.mark.integration
@pytest.mark.parametrize("method, path", OPERATIONS, ids=[f"{m} {p}" for m, p in OPERATIONS])
def test_the_schema_accepts_what_the_api_accepts_and_refuses_what_it_refuses(
        method, path, wsgi_app, admin, running):
    _, token = ApiToken.issue(admin, "schema check")
    auth = {"Authorization": f"Bearer {token}"}
    schema = schemathesis.openapi.from_wsgi("/api/openapi.json", wsgi_app, headers=auth)
    operation = schema[path][method]
    cases = st.one_of(operation.as_strategy(GenerationMode.POSITIVE),
                      operation.as_strategy(GenerationMode.NEGATIVE))
    seen: Counter[str] = Counter()
    mismatches: list[str] = []

    @hypothesis_settings(max_examples=CASES, deadline=None, database=None, derandomize=True,
              phases=[Phase.explicit, Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(case=cases)
    def check(case):
        # Only the body is judged: the path names the running run and one of its islands,
        # and the token is the admin's, whatever was drawn for them.
        positive = case.meta.components[ParameterLocation.BODY].mode.is_positive
        if "run_id" in (case.path_parameters or {}):
            case.path_parameters.update(run_id=running.pk, name="east-a")
        if positive and isinstance(case.body, dict) and case.body.get("initial_checkpoint"):
            # Whether a checkpoint exists is no matter of the schema.
            case.body["initial_checkpoint"] = None
        response = case.call(app=wsgi_app, headers=auth)
        seen[f"{'positive' if positive else 'negative'} {response.status_code}"] += 1
        if positive:
            wrong = refused_for_a_field(response)
            if wrong or response.status_code >= 500 or response.status_code == 400:
                mismatches.append(f"fits the schema, refused {response.status_code}: "
                                  f"{case.body!r} -> {wrong or response.content[:200]}")
        else:
            try:
                case.validate_response(response, checks=[negative_data_rejection],
                                       headers=auth)
            except (AssertionError, FailureGroup) as e:
                mismatches.append(f"does not fit the schema, taken: {case.body!r}: {e}")

    check()

    assert not mismatches, "\n".join(mismatches[:10])
    accepted = sum(n for key, n in seen.items() if key.startswith("positive 2"))
    assert accepted, f"no body that fits the schema was taken: {dict(seen)}"
