"""API tokens: the bearer tokens of the API, of which only a hash is stored."""

from __future__ import annotations

import hashlib
import secrets
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import models
from django.utils import timezone

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class ApiToken(models.Model):
    """A bearer token for the API. Only its hash is stored: the token itself is shown
    once, when it is made."""

    PREFIX = "arch_"

    user = models.ForeignKey(settings.AUTH_USER_MODEL, models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100, blank=True)
    key_hash = models.CharField(max_length=64, unique=True, editable=False)
    hint = models.CharField(max_length=16, editable=False,
                            help_text="The token's first characters.")
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.hint}… ({self.user})"

    @classmethod
    def issue(cls, user: AbstractBaseUser, name: str = "") -> tuple[ApiToken, str]:
        """Make a token for `user`; returns the row and the token, which is not kept."""
        token = cls.PREFIX + secrets.token_urlsafe(32)
        row = cls.objects.create(user=user, name=name[:100], key_hash=hash_token(token),
                                 hint=token[:12])
        return row, token

    @classmethod
    def authenticate(cls, token: str) -> AbstractBaseUser | None:
        """The active user a token belongs to, or None."""
        if not token.startswith(cls.PREFIX) or len(token) > 200:
            return None
        row = cls.objects.select_related("user").filter(key_hash=hash_token(token)).first()
        if row is None or not row.user.is_active:
            return None
        cls.objects.filter(pk=row.pk).update(last_used_at=timezone.now())
        return row.user
