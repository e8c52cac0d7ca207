"""Django views of the API that live outside the NinjaAPI."""

from __future__ import annotations

import json

from django.http import HttpRequest, HttpResponse
from django.views import csrf


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    """CSRF_FAILURE_VIEW: JSON for the API, Django's own page everywhere else."""
    match = request.resolver_match
    if match is None or match.namespace != "api":
        return csrf.csrf_failure(request, reason)
    message = (f"CSRF check failed ({reason}). Send the csrftoken cookie's value in the "
               "X-CSRFToken header, or authenticate with Authorization: Bearer <token>.")
    return HttpResponse(json.dumps({"errors": {"csrf": [message]}}), status=403,
                        content_type="application/json; charset=utf-8")


def not_found(request: HttpRequest, rest: str = "") -> HttpResponse:
    """Any other path under /api/: a 404 in the API's error format."""
    hint = (f" API paths have no trailing slash: {request.path.rstrip('/')}."
            if request.path.endswith("/") else "")
    message = f"No API endpoint at {request.path}.{hint} The endpoints are listed at /api/docs."
    return HttpResponse(json.dumps({"errors": {"path": [message]}}), status=404,
                        content_type="application/json; charset=utf-8")
