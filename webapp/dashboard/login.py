"""Sign-in with a limit on failed attempts, kept by django-axes.

After settings.AXES_FAILURE_LIMIT failed sign-ins for one username (case-insensitive)
from one address, the form refuses further attempts with "Too many failed sign-ins; try
again in M minutes" until settings.AXES_COOLOFF_TIME has passed since the last failure,
and does not check the password meanwhile (so guessing gets no answer either way). A
successful sign-in clears the count. The Django admin's sign-in form does the same.

axes counts the failures (its authentication backend and signal handlers, settings
AXES_*) in the database, so every web process sees the same counts; these forms only
ask it before checking a password, and say how long the lock lasts.
"""

from __future__ import annotations

import math
from typing import Any

from axes.handlers.proxy import AxesProxyHandler
from axes.helpers import get_cool_off
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.forms import AuthenticationForm
from django.contrib.auth.views import LoginView
from django.core.exceptions import ValidationError
from django.db.models import Max
from django.http import HttpRequest

TOO_MANY = "Too many failed sign-ins; try again in %(minutes)s minute%(s)s."


def axes_username(request: HttpRequest, credentials: dict[str, Any] | None) -> str:
    """The username axes counts failures under (AXES_USERNAME_CALLABLE): stripped and
    lowercased, so that "Sam" and "sam " share one count."""
    username = (credentials or request.POST).get("username") or ""
    return username.strip().lower()


def minutes_left(request: HttpRequest, credentials: dict[str, Any]) -> int:
    """Whole minutes, rounded up, until the lock on these credentials lifts."""
    attempts = AxesProxyHandler.get_implementation().get_user_attempts(request, credentials)
    last = max(query.aggregate(last=Max("attempt_time"))["last"] for query in attempts)
    left = last + get_cool_off(request) - request.axes_attempt_time
    return max(1, math.ceil(left.total_seconds() / 60))


class SignInLimit:
    """For a sign-in form: refuses, before the password is checked, a username that axes
    has locked out from the request's address."""

    request: HttpRequest
    cleaned_data: dict[str, Any]

    def clean(self) -> dict[str, Any]:
        credentials = {"username": self.cleaned_data.get("username") or ""}
        if not AxesProxyHandler.is_allowed(self.request, credentials):
            minutes = minutes_left(self.request, credentials)
            raise ValidationError(TOO_MANY, code="too_many",
                                  params={"minutes": minutes, "s": "" if minutes == 1 else "s"})
        return super().clean()  # type: ignore[misc]


class RateLimitedAuthenticationForm(SignInLimit, AuthenticationForm):
    """Django's sign-in form under the limit."""


class RateLimitedAdminAuthenticationForm(SignInLimit, AdminAuthenticationForm):
    """The Django admin's sign-in form under the limit."""


class RateLimitedLoginView(LoginView):
    form_class = RateLimitedAuthenticationForm
