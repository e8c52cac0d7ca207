"""Who is asking and what they may do: bearer tokens and sessions, the role each endpoint
needs, and the lookups that answer 404.

Every endpoint names its action (webapp.runs.roles.ACTIONS) with `allow("operate")`:
the caller is found by a bearer token (no CSRF: a token is not sent by browsers on
their own) or by the session (with CSRF for unsafe methods), then checked against
the action, before the request body is read. Anonymous: 401; a role that may not: 403.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.conf import settings
from ninja.security import APIKeyCookie, HttpBearer
from ninja.utils import check_csrf

from webapp.runs import roles
from webapp.runs.api_token import ApiToken
from webapp.runs.models import Checkpoint, Island, Run

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser
    from django.http import HttpRequest, HttpResponse

SAFE_METHODS = ("GET", "HEAD", "OPTIONS", "TRACE")


class ApiError(Exception):
    """An answer other than success: `status` with {"errors": {key: [message]}}, and
    `headers` (such as Retry-After) besides."""

    def __init__(self, status: int, key: str, message: str,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.key = key
        self.message = message
        self.headers = headers or {}


class CsrfRefused(Exception):
    """A session request without a valid CSRF token; carries the CSRF_FAILURE_VIEW answer."""

    def __init__(self, response: HttpResponse):
        super().__init__("CSRF check failed")
        self.response = response


def _permit(user: AbstractBaseUser, action: str) -> AbstractBaseUser:
    roles.require(user, action)
    return user


class BearerToken(HttpBearer):
    """`Authorization: Bearer arch_...`: an ApiToken (python manage.py create_api_token)."""

    def __init__(self, action: str):
        self.action = action
        super().__init__()

    def authenticate(self, request: HttpRequest, token: str) -> AbstractBaseUser | None:
        user = ApiToken.authenticate(token)
        if user is None:
            return None
        request.user = user
        return _permit(user, self.action)


class SessionLogin(APIKeyCookie):
    """The web app's own session cookie, as the pages use it; unsafe methods need the
    csrftoken cookie's value in the X-CSRFToken header."""

    param_name: str = settings.SESSION_COOKIE_NAME

    def __init__(self, action: str):
        self.action = action
        super().__init__(csrf=False)  # checked below, after the login, so anonymous gets 401

    def authenticate(self, request: HttpRequest, key: str | None) -> AbstractBaseUser | None:
        user = request.user
        if not user.is_authenticated:
            return None
        if request.method not in SAFE_METHODS and (refused := check_csrf(request)):
            raise CsrfRefused(refused)
        return _permit(user, self.action)


def allow(action: str) -> list[Any]:
    """The auth of an endpoint that needs `action` (a key of roles.ACTIONS)."""
    if action not in roles.ACTIONS:
        raise ValueError(f"unknown action {action!r}; expected one of {', '.join(roles.ACTIONS)}")
    return [BearerToken(action), SessionLogin(action)]


def signed_in_user(request: HttpRequest) -> AbstractBaseUser | None:
    """The session's user or the bearer token's, for views outside the NinjaAPI."""
    if request.user.is_authenticated:
        return request.user
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() == "bearer" and token:
        return ApiToken.authenticate(token.strip())
    return None


def get_run(run_id: int) -> Run:
    run = Run.objects.select_related("created_by").filter(pk=run_id).first()
    if run is None:
        raise ApiError(404, "run", f"No run with id {run_id}.")
    return run


def get_island(run: Run, name: str) -> Island:
    """One of the run's islands (in its config; a removed island's row is not one)."""
    # A NUL is in no island's name, and PostgreSQL refuses it even in a query.
    island = None if "\x00" in name else run.current_islands().filter(name=name).first()
    if island is None:
        names = ", ".join(run.current_islands().values_list("name", flat=True)) or "none"
        raise ApiError(404, "island",
                       f"Run {run.pk} has no island named {name!r} (it has {names}).")
    return island


def get_checkpoint(run: Run, checkpoint_id: int) -> Checkpoint:
    checkpoint = Checkpoint.objects.filter(run=run, pk=checkpoint_id).select_related("run").first()
    if checkpoint is None:
        raise ApiError(404, "checkpoint", f"Run {run.pk} has no checkpoint {checkpoint_id}.")
    return checkpoint
