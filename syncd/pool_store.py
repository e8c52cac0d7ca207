"""The keys of the hosts' pools of warm standby islands (not of one run).

The run services push claims for a region's pool managers (trainer/pool_manager.py),
which announce their pools here; syncd.keys names the keys. A manager moves each
claim it takes into its own processing list and drops it from there once handled,
so the claims of a manager that dies on them are still there: a survivor hands them
back to the region's list when the dead one's announcement has gone stale. Each
epoch of an island is started at most once, whoever holds its claim (first_start).
"""

from __future__ import annotations

import json
import time
from typing import Any

import redis

from syncd.keys import pool_key, run_prefix

# A host's claims are handed back once its announcement is this old: well past the
# announcements' pace (trainer/pool_manager.py: every half second).
HAND_BACK_AFTER_S = 10.0


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

    def take_claims(self, region: str, host: str, timeout_s: float
                    ) -> list[tuple[bytes, dict[str, Any]]]:
        """Every claim waiting (waiting up to `timeout_s` for the first), each as (its
        bytes, decoded), moved into `host`'s processing list, where it stays until
        done_claim; [] if none."""
        claims, processing = pool_key(region, "claims"), self._processing(region, host)
        first = self.client.blmove(claims, processing, timeout_s, "LEFT", "RIGHT")
        if first is None:
            return []
        raw = [first]
        while (more := self.client.lmove(claims, processing, "LEFT", "RIGHT")) is not None:
            raw.append(more)
        taken = []
        for item in raw:
            try:
                taken.append((item, json.loads(item)))
            except ValueError:
                taken.append((item, {"unreadable": item.decode(errors="replace")}))
        return taken

    def done_claim(self, region: str, host: str, raw: bytes) -> None:
        """A claim `host` took is handled (started or refused): out of its processing list."""
        self.client.lrem(self._processing(region, host), 1, raw)

    def hand_back_stale(self, region: str, now: float | None = None,
                        after_s: float = HAND_BACK_AFTER_S) -> int:
        """Put the claims of the region's hosts silent for `after_s` (or gone) back at
        the head of the region's list, in their order; returns how many."""
        now = time.time() if now is None else now
        states = {k.decode(): json.loads(v)
                  for k, v in self.client.hgetall(pool_key(region, "hosts")).items()}
        prefix = pool_key(region, "processing:")
        handed = 0
        for key in self.client.scan_iter(match=prefix + "*", count=100):
            host = key.decode()[len(prefix):]
            if now - states.get(host, {}).get("time", 0) <= after_s:
                continue
            while self.client.lmove(key, pool_key(region, "claims"), "RIGHT", "LEFT"):
                handed += 1
        return handed

    def first_start(self, run_id: int | str, island: str, epoch: int) -> bool:
        """True once for each (run, island, epoch): whoever asks first may start it."""
        key = f"{run_prefix(run_id)}started:{island}:{epoch}"
        return bool(self.client.set(key, 1, nx=True, ex=7 * 24 * 3600))

    @staticmethod
    def _processing(region: str, host: str) -> str:
        return pool_key(region, f"processing:{host}")

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

