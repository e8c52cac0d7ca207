"""Who may call what: every endpoint for each role, by session and by bearer token.

Anonymous callers get 401, a role the action is not for gets 403 {"errors":
{"permission": [...]}}, and a role it is for gets the endpoint's success status on a
run in a state where the call succeeds.
"""

import string

import pytest

from webapp.runs.api_token import ApiToken

pytestmark = [pytest.mark.django_db, pytest.mark.integration]

VALID_RUN = {"name": "new", "mode": "decoupled", "config": {}}

# (method, path, body, action, status on success); {draft}, {running}, {paused},
# {checkpoint} and {token} are filled in by target().
ENDPOINTS = [
    ("GET", "/api/runs", None, "view", 200),
    ("POST", "/api/runs", VALID_RUN, "create", 201),
    ("GET", "/api/runs/{running}", None, "view", 200),
    ("PATCH", "/api/runs/{running}", {"archived": True}, "edit", 200),
    ("DELETE", "/api/runs/{draft}", None, "delete", 204),
    ("POST", "/api/runs/{draft}/start", None, "operate", 202),
    ("POST", "/api/runs/{running}/stop", None, "operate", 200),
    ("POST", "/api/runs/{running}/pause", None, "operate", 200),
    ("POST", "/api/runs/{paused}/resume", None, "operate", 200),
    ("POST", "/api/runs/{running}/checkpoint", None, "operate", 202),
    ("GET", "/api/runs/{running}/metrics", None, "view", 200),
    ("GET", "/api/runs/{running}/events", None, "view", 200),
    ("GET", "/api/runs/{running}/islands", None, "view", 200),
    ("POST", "/api/runs/{running}/islands", {"name": "south-a", "region": "us-south"},
     "edit", 201),
    ("DELETE", "/api/runs/{running}/islands/east-b", None, "edit", 204),
    ("POST", "/api/runs/{running}/islands/east-a/faults", {"kind": "kill"}, "fault", 202),
    ("POST", "/api/runs/{running}/islands/east-a/faults",
     {"kind": "straggle", "duration_s": 30, "factor": 3}, "fault", 202),
    ("POST", "/api/runs/{running}/islands/east-a/rejoin", None, "fault", 202),
    ("GET", "/api/runs/{running}/islands/east-a/log", None, "view", 200),
    ("POST", "/api/runs/{running}/regions/us-east/faults", {"kind": "outage"}, "fault", 202),
    ("POST", "/api/system/faults", {"kind": "kill_syncd"}, "admin", 202),
    ("GET", "/api/runs/{running}/checkpoints", None, "view", 200),
    ("GET", "/api/runs/{running}/checkpoints/{checkpoint}/download", None, "view", 200),
    ("POST", "/api/runs/{running}/checkpoints/{checkpoint}/sample",
     {"prompt": "def ", "tokens": 2}, "view", 200),
    ("GET", "/api/config/schema", None, "view", 200),
    ("GET", "/api/tokens", None, "view", 200),
    ("POST", "/api/tokens", {"name": "ci"}, "view", 201),
    ("DELETE", "/api/tokens/{token}", None, "view", 204),
    ("GET", "/api/openapi.json", None, "view", 200),
]
# role -> the actions it may do
ROLES = {
    "anonymous": set(),
    "viewer": {"view"},
    "viewer_token": {"view"},
    "operator": {"view", "create", "operate", "edit", "delete", "fault"},
    "operator_token": {"view", "create", "operate", "edit", "delete", "fault"},
    "admin": {"view", "create", "operate", "edit", "delete", "fault", "admin"},
}
USERS = {"viewer": "viewer", "viewer_token": "viewer", "operator": "operator",
         "operator_token": "operator", "admin": "admin"}


@pytest.fixture
def caller(request, api_for, token_for):
    """(the role's Api, its user or None)."""
    role = request.param
    if role == "anonymous":
        return api_for(), None
    user = request.getfixturevalue(USERS[role])
    if role.endswith("_token"):
        return api_for(None, **token_for(user)), user
    return api_for(user), user


def target(request, name: str, user) -> int:
    """The id a path's {name} stands for: a run or checkpoint fixture, or a token of the
    caller's own."""
    if name == "token":
        row, _ = ApiToken.issue(user or request.getfixturevalue("viewer"), "to revoke")
        return row.pk
    return request.getfixturevalue(name).pk


def endpoint_id(endpoint) -> str:
    method, path, body, _, _ = endpoint
    kind = f" {body['kind']}" if isinstance(body, dict) and "kind" in body else ""
    return f"{method} {path}{kind}"


@pytest.mark.parametrize("caller", list(ROLES), indirect=True)
@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=endpoint_id)
def test_every_endpoint_answers_each_role_as_its_role_allows(caller, endpoint, request):
    api, user = caller
    role = request.node.callspec.params["caller"]
    method, path, body, action, success = endpoint
    url = path.format(**{name: target(request, name, user)
                         for _, name, _, _ in string.Formatter().parse(path) if name})

    response = api.call(method, url, body)

    if role == "anonymous":
        expected = 401
    elif action in ROLES[role]:
        expected = success
    else:
        expected = 403
    assert response.status_code == expected, response.content[:500]
    if expected == 401:
        assert list(response.json()["errors"]) == ["auth"]
    if expected == 403:
        assert list(response.json()["errors"]) == ["permission"]
