"""The JSON API. Every error is {"errors": {key: [message, ...]}}: run config problems are
keyed by dotted path ("sync.min_quorum"), problems with the request by "body", "auth",
"permission", "csrf" or "run".
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import wraps
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import reverse
from django.views import csrf
from django.views.decorators.http import require_GET, require_http_methods

from trainer.config import MODES, ConfigError, field_help
from webapp.runs.models import Run
from webapp.runs.services import create_run, default_config

MAX_BODY_BYTES = 1024 * 1024
BODY_FIELDS = ("name", "mode", "config")

View = Callable[..., HttpResponse]


class BodyError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def error(status: int, key: str, message: str) -> JsonResponse:
    return JsonResponse({"errors": {key: [message]}}, status=status)


def api_login_required(view: View) -> View:
    """Like login_required, but answers 401 in JSON instead of redirecting to a form."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not request.user.is_authenticated:
            return error(401, "auth", "Log in first: the API uses the web app's session.")
        return view(request, *args, **kwargs)

    return wrapper


def read_json_object(request: HttpRequest) -> dict[str, Any]:
    """The request body as a JSON object with only the known fields.

    Raises:
        BodyError: 413 when the body is over MAX_BODY_BYTES, 400 when it is not such an object.
    """
    too_big = BodyError(413, f"The body is larger than the limit of {MAX_BODY_BYTES} bytes.")
    declared = request.META.get("CONTENT_LENGTH") or "0"
    # Refuse by the declared length before reading; check the real length after,
    # for clients that declare none.
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise too_big
    try:
        raw = request.body
    except RequestDataTooBig:
        raise too_big from None
    if len(raw) > MAX_BODY_BYTES:
        raise too_big
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise BodyError(400, f"Not valid JSON: {e}.") from None
    expected = ", ".join(BODY_FIELDS)
    if not isinstance(body, dict):
        raise BodyError(400, f"Must be a JSON object with {expected}.")
    unknown = sorted(set(body) - set(BODY_FIELDS))
    if unknown:
        raise BodyError(400, f"Unknown field {unknown[0]!r}; expected {expected} (the run "
                             "config goes under config).")
    return body


def _runs() -> QuerySet[Run]:
    return Run.objects.select_related("created_by").prefetch_related("islands")


@require_http_methods(["GET", "POST"])
@api_login_required
def runs(request: HttpRequest) -> HttpResponse:
    if request.method == "POST":
        return _create_run(request)
    return JsonResponse({"runs": [run.to_dict() for run in _runs()]})


def _create_run(request: HttpRequest) -> HttpResponse:
    if not request.user.has_perm("runs.add_run"):
        return error(403, "permission", "Creating runs needs the runs.add_run permission.")
    try:
        body = read_json_object(request)
    except BodyError as e:
        return error(e.status, "body", str(e))
    try:
        run = create_run(name=body.get("name", ""), mode=body.get("mode", ""),
                         config=body.get("config", {}), user=request.user)
    except ConfigError as e:
        return JsonResponse({"errors": e.errors}, status=422)
    response = JsonResponse(run.to_dict(), status=201)
    response["Location"] = reverse("api:run", args=[run.pk])
    return response


@require_GET
@api_login_required
def run_detail(request: HttpRequest, run_id: int) -> HttpResponse:
    try:
        run = _runs().get(pk=run_id)
    except Run.DoesNotExist:
        return error(404, "run", f"No run with id {run_id}.")
    return JsonResponse(run.to_dict())


@require_GET
@api_login_required
def config_schema(request: HttpRequest) -> HttpResponse:
    return JsonResponse({
        "defaults": default_config(),
        "help": field_help(),
        "modes": list(MODES),
        "regions": settings.REGIONS,
    })


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    """CSRF_FAILURE_VIEW: JSON for the API, Django's own page everywhere else."""
    match = request.resolver_match
    if match is None or match.namespace != "api":
        return csrf.csrf_failure(request, reason)
    return error(403, "csrf", f"CSRF check failed ({reason}). Send the csrftoken cookie's "
                              "value in the X-CSRFToken header.")
