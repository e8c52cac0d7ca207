"""The signature of a claim of a warm standby. Pure: no Redis, no clock.

The run services sign each claim they push (run, island, epoch, asked_at, island_key,
redis_password: the password of the run's island user, syncd/acl.py)
with the claims key, derived from the web app's SECRET_KEY, which the web side and
its pool managers (manage.py pool_manager) hold and island processes never get
(trainer.launch.island_env). A pool manager starts nothing for a claim whose
signature is missing or wrong, so a claim written into the list by anyone else,
or a signed one with any field changed, starts no island.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

SIGNED_FIELDS = ("run", "island", "epoch", "asked_at", "island_key", "redis_password")


def claims_key(secret_key: str) -> bytes:
    """The key claims are signed with, from the web app's SECRET_KEY."""
    return hmac.new(secret_key.encode(), b"archipelago claims", hashlib.sha256).digest()


def _signature(claim: dict[str, Any], key: bytes) -> str:
    body = json.dumps([claim.get(f) for f in SIGNED_FIELDS], separators=(",", ":"))
    return hmac.new(key, body.encode(), hashlib.sha256).hexdigest()


def sign_claim(claim: dict[str, Any], key: bytes) -> dict[str, Any]:
    """The claim with its signature ("sig")."""
    return {**claim, "sig": _signature(claim, key)}


def claim_signed(claim: dict[str, Any], key: bytes) -> bool:
    """Whether the claim carries a good signature under `key`."""
    sig = claim.get("sig")
    return isinstance(sig, str) and hmac.compare_digest(sig, _signature(claim, key))
