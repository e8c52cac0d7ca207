"""Sign-in with a limit on failed attempts.

After settings.LOGIN_FAILURE_LIMIT failed sign-ins for one username from one address
within settings.LOGIN_FAILURE_WINDOW_S seconds, the form refuses further attempts with
"Too many failed sign-ins; try again in M minutes" until the window has passed, and
does not check the password meanwhile (so guessing gets no answer either way). A
successful sign-in clears the count.

The counts live in Django's cache (settings.CACHES "default"). The default backend is
in the memory of the web process, which is enough for the one Daphne process that
`python -m webapp.start` runs; several web processes need a shared cache (Redis).
"""

from __future__ import annotations

import hashlib
import math
import time
from typing import Any

from django.conf import settings
from django.contrib.auth.forms import AuthenticationForm
from django.contrib.auth.views import LoginView
from django.core.cache import cache
from django.core.exceptions import ValidationError


def failure_key(username: str, address: str) -> str:
    """The cache key of a username (case-insensitive) signing in from an address."""
    digest = hashlib.sha256(f"{username.strip().lower()}\n{address}".encode()).hexdigest()
    return f"login-failures:{digest}"


class RateLimitedAuthenticationForm(AuthenticationForm):
    """Django's sign-in form that counts failures per username and address."""

    error_messages = {
        **AuthenticationForm.error_messages,
        "too_many": "Too many failed sign-ins; try again in %(minutes)s minute%(s)s.",
    }

    def clean(self) -> dict[str, Any]:
        username = self.cleaned_data.get("username") or ""
        address = self.request.META.get("REMOTE_ADDR", "") if self.request else ""
        key = failure_key(username, address)
        now = time.time()
        record = cache.get(key)
        if record and record["count"] >= settings.LOGIN_FAILURE_LIMIT \
                and record["until"] > now:
            minutes = math.ceil((record["until"] - now) / 60)
            raise ValidationError(self.error_messages["too_many"], code="too_many",
                                  params={"minutes": minutes, "s": "" if minutes == 1 else "s"})
        try:
            cleaned = super().clean()
        except ValidationError:
            self._count_failure(key, record, now)
            raise
        cache.delete(key)
        return cleaned

    @staticmethod
    def _count_failure(key: str, record: dict[str, float] | None, now: float) -> None:
        if not record or record["until"] <= now:
            record = {"count": 0, "until": now + settings.LOGIN_FAILURE_WINDOW_S}
        record = {"count": record["count"] + 1, "until": record["until"]}
        cache.set(key, record, timeout=max(1, math.ceil(record["until"] - now)))


class RateLimitedLoginView(LoginView):
    form_class = RateLimitedAuthenticationForm
