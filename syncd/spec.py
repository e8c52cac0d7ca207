"""The spec of a run as syncd follows it: its config, keys and mode.

Islands may be added to or removed from a running run (the web app rewrites the
spec in Redis), so the config is read again at the watch's pace. The secret (from
its own key, which islands do not read), the keys derived from it (diloco.signing)
and the mode are the run's from its start. The parts of a RunSync read the config
here, where it is current; only `follow` changes it.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from diloco.config import RunConfig
from diloco.config_parse import config_from_spec
from diloco.signing import publish_key

if TYPE_CHECKING:
    from syncd.store import RunStore


class RunSpec:
    """Args:
        store: the run's Redis keys.

    Raises:
        ValueError: the run has no spec or no secret in Redis.
    """

    def __init__(self, store: RunStore):
        self.store = store
        raw = store.raw_spec()
        if raw is None:
            raise ValueError(f"run {store.run_id} has no spec in Redis")
        self.raw = raw
        self.initial: dict[str, Any] = json.loads(raw)
        self.config: RunConfig = config_from_spec(self.initial)
        secret = store.secret()
        if secret is None:
            raise ValueError(f"run {store.run_id} has no secret in Redis")
        self.secret = secret  # the island keys derive from it (syncd.ingest)
        self.publish_key = publish_key(secret)
        self.verify_key = self.publish_key.public_key()
        # The elastic baseline: a barrier over alive islands at every outer step, a
        # checkpoint after each, and a whole-job restart from it on any island loss.
        self.elastic = self.initial["mode"] == "elastic"
        # Synchronous DiLoCo: each merge waits for every alive island (min_quorum M and
        # overlap_steps 0, diloco.config.MODE_RULES, make the islands wait for it).
        self.barrier = self.elastic or self.initial["mode"] == "sync"

    def island_names(self) -> set[str]:
        return {i.name for i in self.config.islands}

    def follow(self) -> bool:
        """Read the spec again; True if it changed (the config is the new one)."""
        raw = self.store.raw_spec()
        if raw is None or raw == self.raw:
            return False
        self.raw = raw
        self.config = config_from_spec(json.loads(raw))
        return True
