"""What signing a message costs: `python -m bench signing [--quick]`.

Every byte of every message is hashed by its sender and again by its receiver
(diloco.protocol): an update's tag, a global's signature over a digest. Protocol 2
hashes with BLAKE3 (keyed with the island's key for an update's tag; Ed25519 over
the digest for a global); protocol 1 used SHA-256 (HMAC-SHA256; Ed25519 over the
SHA-256 digest). This times both on the same message bodies of 1 MB and 100 MB
(random bytes: the hash does not care what they are), an update's tag, a global's
signature and its check, and reports the median of several repeats in ms (the ways
take turns within each repeat, so a burst of other work on the machine falls on all
of them alike). It writes bench/results/signing.json (signing-quick.json with
--quick) and prints a table.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import blake3

from bench import results
from diloco.signing import island_key, publish_key

SECRET = b"bench-signing"
PROFILES: dict[str, dict[str, Any]] = {
    "full": {"sizes_mb": (1, 100), "repeats": {1: 50, 100: 7}},
    "quick": {"sizes_mb": (1, 10), "repeats": {1: 5, 10: 3}},
}
WAYS = ["tag_sha256_ms", "tag_blake3_ms", "sign_sha256_ms", "sign_blake3_ms",
        "verify_sha256_ms", "verify_blake3_ms"]


def costs(size_bytes: int, repeats: int) -> dict[str, float]:
    """Median ms of each way on a body of `size_bytes`: an update's tag (its check costs
    the same and a compare), a global's signature and its check, by protocol 1's hash
    (sha256) and protocol 2's (blake3)."""
    body = memoryview(bytearray(os.urandom(size_bytes)))
    key = island_key(SECRET, "bench", 1)
    private = publish_key(SECRET)
    public = private.public_key()
    signed = {"sha256": private.sign(hashlib.sha256(body).digest()),
              "blake3": private.sign(blake3.blake3(body).digest())}
    ways: dict[str, Callable[[], object]] = {
        "tag_sha256_ms": lambda: hmac.new(key, body, hashlib.sha256).digest(),
        "tag_blake3_ms": lambda: blake3.blake3(body, key=key).digest(),
        "sign_sha256_ms": lambda: private.sign(hashlib.sha256(body).digest()),
        "sign_blake3_ms": lambda: private.sign(blake3.blake3(body).digest()),
        "verify_sha256_ms": lambda: public.verify(signed["sha256"],
                                                  hashlib.sha256(body).digest()),
        "verify_blake3_ms": lambda: public.verify(signed["blake3"], blake3.blake3(body).digest()),
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
    print(results.table(rows, ["size_mb", *WAYS]))
    results.say(f"wrote {path}")
    return 0
