"""What signing a publish costs: `python -m bench signing [--quick]`.

syncd signs every message it publishes with the run's Ed25519 publish key over the
message's SHA-256 digest (diloco.protocol); islands verify it. Before, both sides
computed an HMAC-SHA256 of the message under the run's secret. This times both
ways on the same message bodies of 1 MB and 100 MB (random bytes: the hash does not
care what they are), sign and verify apart, and reports the median of several
repeats in ms (the four ways take turns). It writes bench/results/signing.json
(signing-quick.json with --quick) and prints a table.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

from bench import results
from diloco.signing import publish_key

SECRET = b"bench-signing"
PROFILES: dict[str, dict[str, Any]] = {
    "full": {"sizes_mb": (1, 100), "repeats": {1: 50, 100: 7}},
    "quick": {"sizes_mb": (1, 10), "repeats": {1: 5, 10: 3}},
}


def costs(size_bytes: int, repeats: int) -> dict[str, float]:
    """Median ms to sign and to verify a body of `size_bytes`, the HMAC way and the
    Ed25519 way. The four take turns within each repeat, so a burst of other work on
    the machine falls on all of them alike."""
    body = memoryview(bytearray(os.urandom(size_bytes)))
    private = publish_key(SECRET)
    public = private.public_key()
    tag = hmac.new(SECRET, body, hashlib.sha256).digest()
    signature = private.sign(hashlib.sha256(body).digest())
    ways: dict[str, Callable[[], object]] = {
        "hmac_sign_ms": lambda: hmac.new(SECRET, body, hashlib.sha256).digest(),
        "hmac_verify_ms": lambda: hmac.compare_digest(
            tag, hmac.new(SECRET, body, hashlib.sha256).digest()),
        "ed25519_sign_ms": lambda: private.sign(hashlib.sha256(body).digest()),
        "ed25519_verify_ms": lambda: public.verify(signature, hashlib.sha256(body).digest()),
    }
    times: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(repeats):
        for name, way in ways.items():
            started = time.perf_counter()
            way()
            times[name].append((time.perf_counter() - started) * 1000)
    return {name: statistics.median(ms) for name, ms in times.items()}


def main(quick: bool = False) -> int:
    profile = PROFILES["quick" if quick else "full"]
    rows = []
    for mb in profile["sizes_mb"]:
        results.say(f"signing: {mb} MB, {profile['repeats'][mb]} repeats")
        rows.append({"size_mb": mb, **costs(mb * 10**6, profile["repeats"][mb])})
    path = results.write("signing-quick" if quick else "signing", {"rows": rows})
    print(results.table(rows, ["size_mb", "hmac_sign_ms", "ed25519_sign_ms", "hmac_verify_ms",
                               "ed25519_verify_ms"]))
    results.say(f"wrote {path}")
    return 0
