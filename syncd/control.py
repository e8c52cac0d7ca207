"""Commands for syncd processes, wherever they run (not for one run)."""

from __future__ import annotations

import redis

from syncd.keys import SYNCD_CONTROL_KEY


def kill_syncd(client: redis.Redis) -> None:
    """Ask syncd to SIGKILL itself (a fault for admins); works wherever it runs."""
    client.rpush(SYNCD_CONTROL_KEY, "kill")


def syncd_command(client: redis.Redis) -> str | None:
    """The next command for syncd, or None."""
    raw = client.lpop(SYNCD_CONTROL_KEY)
    return raw.decode() if raw else None
