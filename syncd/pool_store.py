"""The keys of the hosts' pools of warm standby islands (not of one run).

The run services push claims for a region's pool managers (trainer/pool_manager.py),
which announce their pools here; syncd.keys names the keys.
"""

from __future__ import annotations

import json
import time
from typing import Any

import redis

from syncd.keys import pool_key


class PoolStore:
    """The keys of the hosts' pools of warm standby islands (not of one run).

    Args:
        client: a connection from `connect`.
        fresh_s: a host's announcement older than this is not believed.
    """

    def __init__(self, client: redis.Redis, fresh_s: float = 3.0):
        self.client = client
        self.fresh_s = fresh_s

    def push_claim(self, region: str, claim: dict[str, Any]) -> None:
        """Ask the region's pool managers to start an island; they take claims in order."""
        self.client.rpush(pool_key(region, "claims"), json.dumps(claim))

    def take_claims(self, region: str, timeout_s: float) -> list[dict[str, Any]]:
        """Every claim waiting (waiting up to `timeout_s` for the first); [] if none."""
        first = self.client.blpop([pool_key(region, "claims")], timeout=timeout_s)
        if first is None:
            return []
        raw = [first[1]]
        while (more := self.client.lpop(pool_key(region, "claims"))) is not None:
            raw.append(more)
        claims = []
        for item in raw:
            try:
                claims.append(json.loads(item))
            except ValueError:
                claims.append({"unreadable": item.decode(errors="replace")})
        return claims

    def put_host(self, region: str, host: str, state: dict[str, Any]) -> None:
        self.client.hset(pool_key(region, "hosts"), host, json.dumps(state))

    def remove_host(self, region: str, host: str) -> None:
        self.client.hdel(pool_key(region, "hosts"), host)

    def hosts(self, region: str, now: float | None = None) -> dict[str, dict[str, Any]]:
        """The region's pool managers that announced themselves in the last `fresh_s`."""
        now = time.time() if now is None else now
        raw = self.client.hgetall(pool_key(region, "hosts"))
        states = {k.decode(): json.loads(v) for k, v in raw.items()}
        return {h: s for h, s in states.items() if now - s.get("time", 0) <= self.fresh_s}

    def ready(self, region: str, now: float | None = None) -> int:
        """Standbys ready in the region, as its pool managers last said."""
        return sum(int(s.get("ready", 0)) for s in self.hosts(region, now).values())

