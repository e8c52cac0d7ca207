"""The JSON API (django-ninja): one NinjaAPI with the routers of webapp/api, its body
parser, and the error handlers.

Every error is {"errors": {key: [message, ...]}}: run config problems are keyed by
dotted path ("sync.min_quorum"), a body field by its name ("duration_s"), other
problems by "body", "auth", "permission", "csrf", "run", "island", "checkpoint",
"state". The schema is at /api/openapi.json and the browsable docs at /api/docs,
both for signed-in users only.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied, RequestDataTooBig
from django.http import Http404, HttpRequest, HttpResponse
from ninja import NinjaAPI, Swagger
from ninja.errors import AuthenticationError, HttpError, ValidationError, ValidationErrorContext
from ninja.openapi.docs import render_template
from ninja.parser import Parser
from ninja.renderers import JSONRenderer
from pydantic import BaseModel

from diloco.config_parse import ConfigError
from syncd.finite import finite
from webapp.api import checkpoints, islands, runs, tokens
from webapp.api.access import ApiError, CsrfRefused, signed_in_user
from webapp.runs.models import WrongState

MAX_BODY_BYTES = 1024 * 1024
SIGN_IN = ("Sign in, or send Authorization: Bearer <token> (make one in the web app or "
           "with python manage.py create_api_token USERNAME).")

JSON_TYPES = {list: "an array", str: "a string", int: "a number", float: "a number",
              bool: "true or false", type(None): "null", dict: "an object"}


class BodyError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class JsonObjectParser(Parser):
    """JSON bodies: at most MAX_BODY_BYTES, and an object."""

    def parse_body(self, request: HttpRequest) -> dict[str, Any]:
        declared = request.META.get("CONTENT_LENGTH") or "0"
        too_big = BodyError(413, f"The body is larger than the limit of {MAX_BODY_BYTES} bytes.")
        if (declared.isascii() and declared.isdecimal() and int(declared) > MAX_BODY_BYTES) \
                or len(request.body) > MAX_BODY_BYTES:
            raise too_big
        try:
            body = json.loads(request.body)
        except (ValueError, RecursionError) as e:
            raise BodyError(400, f"Not valid JSON: {e}.") from None
        if not isinstance(body, dict):
            raise BodyError(400, f"Must be a JSON object, got {JSON_TYPES[type(body)]}.")
        if _has_nul(body):
            # PostgreSQL cannot store it, and no field here has a use for it.
            raise BodyError(400, "Text must not contain NUL characters (\\u0000).")
        return body


def _has_nul(value: Any) -> bool:
    """Whether a string anywhere in decoded JSON (keys too) holds a NUL character."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


class FiniteJSONRenderer(JSONRenderer):
    """JSON a browser can parse: a NaN or an infinity is rendered as null."""

    def render(self, request: HttpRequest, data: Any, *, response_status: int) -> Any:
        return super().render(request, finite(data), response_status=response_status)


class ArchipelagoApi(NinjaAPI):
    """NinjaAPI whose validation errors read like the rest: {"errors": {field: [sentence]}}."""

    def validation_error_from_error_contexts(
            self, error_contexts: list[ValidationErrorContext]) -> ValidationError:
        errors: list[dict[str, Any]] = []
        for context in error_contexts:
            model = context.model
            for error in context.pydantic_validation_error.errors(include_url=False):
                loc = model.__ninja_flatten_map_reverse__.get(error["loc"], error["loc"])
                source = model.__ninja_param_source__
                errors.append({"key": _error_key(source, loc),
                               "message": _error_message(error, model, source, loc)})
        return ValidationError(errors)


def _error_key(source: str, loc: tuple[Any, ...]) -> str:
    # A body's fields sit under the view's parameter name, which the client never sees.
    path = loc[1:] if source == "body" else loc
    return ".".join(str(part) for part in path) or source


def _error_message(error: dict[str, Any], model: type[BaseModel], source: str,
                   loc: tuple[Any, ...]) -> str:
    kind, ctx, given = error["type"], error.get("ctx", {}), error.get("input")
    # A query or path parameter is always text: show it as the client wrote it.
    shown = given if source in ("query", "path") and isinstance(given, str) else repr(given)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    if kind == "missing":
        return "This field is required." if len(loc) > 1 or source != "body" \
            else "Send a JSON object."
    if kind == "extra_forbidden":
        schema = _schema_at(model, loc[:-1])
        if schema is None:
            return "Unknown field."
        hint = f" ({schema.unknown_hint})" if getattr(schema, "unknown_hint", "") else ""
        return f"Unknown field; expected {', '.join(schema.model_fields)}{hint}."
    if kind in ("literal_error", "enum"):
        return f"Must be {ctx['expected']}, got {shown}."
    if kind == "value_error":
        return str(ctx["error"])
    bounds = {"greater_than": "more than", "greater_than_equal": "at least",
              "less_than": "less than", "less_than_equal": "at most"}
    if kind in bounds:
        limit = next(iter(ctx.values()))
        return f"Must be {bounds[kind]} {limit}, got {shown}."
    return f"{error['msg']}, got {shown}."


def _schema_at(model: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The schema class whose field `loc` names, walking down from the view's params."""
    current: Any = model
    for part in loc:
        fields = getattr(current, "model_fields", None)
        if not fields or part not in fields:
            return None
        current = fields[part].annotation
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


class SessionSwagger(Swagger):
    """Swagger UI whose "Try it out" works with the session: it sends the CSRF token.
    (Every endpoint takes the session, but per endpoint, which ninja's own check of the
    API-wide auth does not see.)"""

    def render_page(self, request: HttpRequest, api: NinjaAPI, **kwargs: Any) -> HttpResponse:
        self.settings["url"] = self.get_openapi_url(api, kwargs)
        context = {"swagger_settings": json.dumps(self.settings, indent=1), "api": api,
                   "add_csrf": True}
        return render_template(request, self.template, self.template_cdn, context)


def _docs_login_required(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """The docs and the schema are for signed-in users (a session, or a bearer token for
    the schema); the docs page sends anonymous browsers to the login form."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if signed_in_user(request) is None:
            if request.path.endswith(".json"):
                return _errors(401, {"auth": [SIGN_IN]})
            return redirect_to_login(request.get_full_path())
        return view(request, *args, **kwargs)

    return wrapper


api = ArchipelagoApi(
    title="Archipelago",
    version="1",
    description="Runs of Decoupled DiLoCo across islands: create, start, break and heal "
                "them. Authenticate with the web app's session (and its CSRF token) or "
                "`Authorization: Bearer <token>`.",
    urls_namespace="api",
    parser=JsonObjectParser(),
    renderer=FiniteJSONRenderer(),
    docs=SessionSwagger(),
    docs_decorator=_docs_login_required,
)
api.add_router("/runs", runs.router)
api.add_router("/runs", islands.router)
api.add_router("/runs", checkpoints.router)
api.add_router("/", runs.config)
api.add_router("/", islands.system)
api.add_router("/tokens", tokens.router)


def _errors(status: int, errors: dict[str, list[str]]) -> HttpResponse:
    return HttpResponse(json.dumps({"errors": errors}), status=status,
                        content_type="application/json; charset=utf-8")


@api.exception_handler(ApiError)
def _api_error(request: HttpRequest, exc: ApiError) -> HttpResponse:
    response = _errors(exc.status, {exc.key: [exc.message]})
    for name, value in exc.headers.items():
        response[name] = value
    return response


@api.exception_handler(ValidationError)
def _validation_error(request: HttpRequest, exc: ValidationError) -> HttpResponse:
    errors: dict[str, list[str]] = {}
    for error in exc.errors:
        errors.setdefault(error["key"], []).append(error["message"])
    return _errors(422, errors)


@api.exception_handler(ConfigError)
def _config_error(request: HttpRequest, exc: ConfigError) -> HttpResponse:
    return _errors(422, exc.errors)


@api.exception_handler(WrongState)
def _wrong_state(request: HttpRequest, exc: WrongState) -> HttpResponse:
    # The services raise WrongState for what the run's state does not allow; what the
    # request itself gets wrong is refused before they are called, and any other error
    # (a ValueError of a service, an answer that does not fit its schema) is our bug: 500.
    return _errors(409, {"state": [str(exc)]})


@api.exception_handler(AuthenticationError)
def _anonymous(request: HttpRequest, exc: AuthenticationError) -> HttpResponse:
    response = _errors(401, {"auth": [SIGN_IN]})
    response["WWW-Authenticate"] = 'Bearer realm="archipelago"'
    return response


@api.exception_handler(PermissionDenied)
def _forbidden(request: HttpRequest, exc: PermissionDenied) -> HttpResponse:
    return _errors(403, {"permission": [str(exc) or "You may not do this."]})


@api.exception_handler(PermissionError)
def _forbidden_by_service(request: HttpRequest, exc: PermissionError) -> HttpResponse:
    return _errors(403, {"permission": [str(exc)]})


@api.exception_handler(CsrfRefused)
def _csrf(request: HttpRequest, exc: CsrfRefused) -> HttpResponse:
    return exc.response


@api.exception_handler(HttpError)
def _http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
    # The body parser's own refusals come wrapped in ninja's HttpError(400).
    if isinstance(exc.__cause__, BodyError):
        return _errors(exc.__cause__.status, {"body": [str(exc.__cause__)]})
    return _errors(exc.status_code, {"request": [exc.message]})


@api.exception_handler(RequestDataTooBig)
def _too_big(request: HttpRequest, exc: RequestDataTooBig) -> HttpResponse:
    return _errors(413, {"body": [f"The body is larger than the limit of {MAX_BODY_BYTES} "
                                  "bytes."]})


@api.exception_handler(Http404)
def _not_found(request: HttpRequest, exc: Http404) -> HttpResponse:
    return _errors(404, {"path": [f"Nothing at {request.path}."]})
