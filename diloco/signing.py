"""The keys of a run, all derived from its one secret, which only syncd and the web
app hold (arch:R:secret).

- An island's key, HMAC-SHA256(run secret, "<island>:<epoch>"), signs the updates of
  that island's epoch and nothing else. The control plane derives it when it
  launches the epoch and hands it to the island process in its environment
  (trainer.launch.ISLAND_KEY_ENV); syncd derives it again from the name and epoch
  that a stream entry gives, so an island cannot sign as another, nor as an older
  or newer epoch of itself.
- The publish key, an Ed25519 key whose seed is HMAC-SHA256(run secret, "publish"),
  signs what syncd publishes. Islands hold only its public half (the spec's
  "verify_key"): they can check a global fragment, not forge one.
- The password of the run's Redis user, HMAC-SHA256(run secret, "redis user"), which
  the run's islands connect with (syncd/acl.py): the control plane and syncd derive
  it again whenever they need it, so it is kept in no key at all.
"""

from __future__ import annotations

import hashlib
import hmac

from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat


def island_key(secret: bytes, island: str, epoch: int) -> bytes:
    """The key (32 bytes) that one epoch of one island of the run whose secret this is
    tags its updates with (diloco.protocol)."""
    return hmac.new(secret, f"{island}:{epoch}".encode(), hashlib.sha256).digest()


def redis_password(secret: bytes) -> str:
    """The password (hex) of the Redis user of the run whose secret this is."""
    return hmac.new(secret, b"redis user", hashlib.sha256).hexdigest()


def publish_key(secret: bytes) -> Ed25519PrivateKey:
    """The key syncd signs the run's published globals with."""
    return Ed25519PrivateKey.from_private_bytes(
        hmac.new(secret, b"publish", hashlib.sha256).digest())


def verify_key_hex(secret: bytes) -> str:
    """The publish key's public half, as the spec carries it to islands."""
    return publish_key(secret).public_key().public_bytes(Encoding.Raw, PublicFormat.Raw).hex()


def load_verify_key(hex_key: str) -> Ed25519PublicKey:
    """The public key a spec's "verify_key" names.

    Raises:
        ValueError: not 32 bytes of hex.
    """
    return Ed25519PublicKey.from_public_bytes(bytes.fromhex(hex_key))
