"""The API under generated input: every operation of /api/openapi.json, fuzzed with
schemathesis through the real Django app, never answers with a server error.

The schema is read from the app itself (GET /api/openapi.json with an admin's bearer
token, so every endpoint is reachable). For each operation schemathesis draws cases
that fit the schema and cases that do not (wrong types, missing fields, values out of
range), sends them through Django's WSGI handler (which turns an exception into a 500,
as in production) and runs its not_a_server_error check. Path parameters are often
swapped for ids that exist (runs in each state, their islands, a real checkpoint, the
admin's tokens), so that generated bodies reach the services instead of a 404.

FUZZ_CASES (default 260) is the number of cases over all operations; the figure for
docs/RELIABILITY.md comes from a run with FUZZ_CASES=1300. Left out: POST
/api/system/faults (kill_syncd), whose one effect is a command to a syncd that the
tests do not run.
"""

from __future__ import annotations

import os
from collections import Counter

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.generation.modes import GenerationMode

from webapp.api.api import api
from webapp.runs.api_token import ApiToken
from webapp.runs.lifecycle import create_run
from webapp.runs.models import Run

pytestmark = [pytest.mark.django_db, pytest.mark.integration]

FUZZ_CASES = int(os.environ.get("FUZZ_CASES", "260"))
EXCLUDED = {("POST", "/api/system/faults")}
OPERATIONS = sorted((method.upper(), path)
                    for path, methods in api.get_openapi_schema()["paths"].items()
                    for method in methods
                    if (method.upper(), path) not in EXCLUDED)
CASES_EACH = max(4, FUZZ_CASES // len(OPERATIONS))
# operation -> cases sent, server errors seen (printed at the end of the module)
TALLY: Counter[str] = Counter()


@pytest.fixture(scope="module", autouse=True)
def _report(request):
    yield
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and TALLY:
        reporter.write_line(
            f"\nfuzz: {TALLY['cases']} cases over {TALLY['operations']} operations, "
            f"{TALLY['server_errors']} server errors; answers: "
            + ", ".join(f"{key.split()[1]} x{n}" for key, n in sorted(TALLY.items())
                        if key.startswith("status ")))


@pytest.fixture
def targets(request, admin, redis_url, enqueued) -> dict[str, list]:
    """Ids that exist, for the path parameters: runs in every state, island names and
    regions of those runs, a real checkpoint, and the admin's tokens."""
    checkpoint = request.getfixturevalue("checkpoint")
    runs = [request.getfixturevalue(name) for name in ("draft", "running", "paused")]
    runs.append(create_run(name="stopped", mode="decoupled", config=runs[0].config,
                           user=None))
    Run.objects.filter(pk=runs[-1].pk).update(state=Run.State.STOPPED)
    tokens = [ApiToken.issue(admin, f"fuzz {i}")[0].pk for i in range(3)]
    return {"run_id": [run.pk for run in runs], "checkpoint_id": [checkpoint.pk],
            "name": ["east-a", "east-b", "west-a"], "region": ["us-east", "us-west"],
            "token_id": tokens}


def with_known_ids(case, choices: dict[str, object]):
    for name, value in choices.items():
        if value is not None and name in (case.path_parameters or {}):
            case.path_parameters[name] = value
    return case


@pytest.mark.parametrize("method, path", OPERATIONS, ids=[f"{m} {p}" for m, p in OPERATIONS])
def test_no_generated_request_makes_the_api_fail_with_a_server_error(method, path, wsgi_app,
                                                                     admin, targets):
    _, token = ApiToken.issue(admin, "fuzzer")
    auth = {"Authorization": f"Bearer {token}"}
    schema = schemathesis.openapi.from_wsgi("/api/openapi.json", wsgi_app, headers=auth)
    operation = schema[path][method]
    cases = st.one_of(operation.as_strategy(GenerationMode.POSITIVE),
                      operation.as_strategy(GenerationMode.NEGATIVE))
    # Three times in four each path parameter names something that exists.
    known = st.fixed_dictionaries({name: st.one_of(st.none(), st.sampled_from(values),
                                                   st.sampled_from(values),
                                                   st.sampled_from(values))
                                   for name, values in targets.items()})
    TALLY["operations"] += 1

    @settings(max_examples=CASES_EACH, deadline=None, database=None, derandomize=True,
              phases=[Phase.explicit, Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(case=cases, choices=known)
    def fuzz(case, choices):
        case = with_known_ids(case, choices)
        TALLY["cases"] += 1
        response = case.call(app=wsgi_app, headers=auth)
        TALLY[f"status {response.status_code}"] += 1
        if response.status_code >= 500:
            TALLY["server_errors"] += 1
        case.validate_response(response, checks=[not_a_server_error], headers=auth)

    fuzz()


# Inputs that made the API fail with a server error once (found while fuzzing and
# probing around it, on SQLite and PostgreSQL), each now refused with a message.
# (method, path, body, status, error key); {running}, {checkpoint}, {draft} are ids.
FOUND = [
    ("GET", "/api/runs?offset=" + str(2**70), None, 422, "offset"),
    ("GET", "/api/runs/{running}/metrics?since=0001-01-01T00:00:00%2B05:00", None, 422,
     "since"),
    ("POST", "/api/runs", {"name": "huge seed", "mode": "decoupled",
                           "config": {"seed": 10**400}}, 422, "seed"),
    ("POST", "/api/runs", {"name": "huge speed", "mode": "decoupled",
                           "config": {"sync": {"min_quorum": 1},
                                      "islands": [{"name": "a", "region": "us-east",
                                                   "speed": 10**400}]}}, 422,
     "islands.0.speed"),
    ("POST", "/api/runs", {"name": "a\x00b", "mode": "decoupled", "config": {}}, 400, "body"),
    ("POST", "/api/runs", {"name": "nul in config", "mode": "decoupled",
                           "config": {"data": {"path": "x\x00"}}}, 400, "body"),
    ("POST", "/api/tokens", {"name": "a\x00"}, 400, "body"),
    ("POST", "/api/runs/{draft}/islands", {"name": "x\x00", "region": "us-east"}, 400, "body"),
    ("GET", "/api/runs/{running}/islands/%00/log", None, 404, "island"),
    ("POST", "/api/runs/{running}/checkpoints/{checkpoint}/sample",
     {"prompt": "a", "tokens": 2, "seed": 2**70}, 422, "seed"),
    ("POST", "/api/runs/{running}/checkpoints/{checkpoint}/sample",
     {"prompt": "\ud800", "tokens": 2}, 422, "prompt"),
]


@pytest.mark.parametrize("method, path, body, status, key", FOUND,
                         ids=[f"{m} {p[:40]} {k}" for m, p, _, _, k in FOUND])
def test_inputs_that_once_failed_are_refused_with_a_message(method, path, body, status, key,
                                                            admin, request, redis_url,
                                                            enqueued, api_for, token_for):
    ids = {name: request.getfixturevalue(name).pk
           for name in ("running", "checkpoint", "draft") if f"{{{name}}}" in path}
    api = api_for(None, **token_for(admin))

    response = api.call(method, path.format(**ids), body)

    assert response.status_code == status, response.content[:300]
    assert list(response.json()["errors"]) == [key], response.json()
