"""Redis as the runtime's shared memory: the front over one run's keys.

`RunStore` is what a process holds for a run. It holds the run's parts as
attributes, each a module of one idea, so that a consumer's real dependency shows
in its calls: `store.updates` (syncd.update_stream: islands -> syncd),
`store.globals` (syncd.globals_store: syncd -> islands), `store.signals`
(syncd.island_signals: heartbeats, deaths, logs, commands, cursors, faults) and
`store.control` (syncd.run_control: the control flags a user sets, pause, stop,
checkpoint, rejoin, the budget spent, elastic restarts, the chaos schedule's
progress). This module keeps the run itself: its spec and membership, the status
snapshot, and the release of an ended run's keys. syncd.keys names every key.

When a run ends (`release`), its keys go (on the control Redis and the data plane)
but its status snapshot and the islands' log lines, which the control room shows for
a finished run.
"""

from __future__ import annotations

import json
from typing import Any

import redis
from redis.client import Pipeline

from diloco.signing import verify_key_hex
from syncd.bulk import Served
from syncd.fence import Lease
from syncd.globals_store import GlobalsStore
from syncd.island_signals import IslandSignals
from syncd.keys import RUNS_KEY, active_key, lease_key
from syncd.run_control import RunControl
from syncd.run_keys import RunKeys
from syncd.update_stream import UpdateStream

# What stays of a run that ended, for the control room: its last status and the logs.
KEPT_AFTER_END = ("status", "status_seq", "log")


class RunStore(RunKeys):
    """The Redis keys of one run: its parts (`updates`, `globals`, `signals`,
    `control`) and the run's own keys.

    Args: those of syncd.run_keys.RunKeys, which every part shares.
    """

    def __init__(self, client: redis.Redis, run_id: int | str, fence: Lease | None = None,
                 chunk_bytes: int | None = None, data: redis.Redis | None = None,
                 served: Served | None = None, writer: redis.Redis | None = None,
                 data_writer: redis.Redis | None = None):
        keys = (client, run_id, fence, chunk_bytes, data, served, writer, data_writer)
        super().__init__(*keys)
        self.updates = UpdateStream(*keys)
        self.globals = GlobalsStore(*keys)
        self.signals = IslandSignals(*keys)
        self.control = RunControl(*keys)

    # -- run spec and membership ---------------------------------------------

    def put_spec(self, mode: str, config: dict[str, Any], secret: str,
                 initial_checkpoint: dict[str, str] | None = None) -> None:
        """What the processes of a run read: mode, config, the public key of syncd's
        publishes, and the checkpoint ({"path", "sha256"}) its global model starts
        from, if any. The secret (hex) goes in a key of its own, which islands never
        read (diloco.signing)."""
        spec = {"mode": mode, "config": config,
                "verify_key": verify_key_hex(bytes.fromhex(secret))}
        if initial_checkpoint:
            spec["initial_checkpoint"] = initial_checkpoint
        self.client.set(self.key("secret"), secret)
        self.client.set(self.key("spec"), json.dumps(spec))
        self.client.sadd(RUNS_KEY, self.run_id)
        self.client.set(active_key(self.run_id), 1)

    def secret(self) -> bytes | None:
        """The run's secret, for syncd: the island keys and the publish key derive from it."""
        raw = self.client.get(self.key("secret"))
        return bytes.fromhex(raw.decode()) if raw else None

    def spec(self) -> dict[str, Any] | None:
        raw = self.client.get(self.key("spec"))
        return json.loads(raw) if raw else None

    def deactivate(self) -> None:
        def fill(pipe: Pipeline) -> None:
            pipe.srem(RUNS_KEY, self.run_id)
            pipe.delete(active_key(self.run_id))

        self._write(fill)

    @staticmethod
    def active_runs(client: redis.Redis) -> list[str]:
        return sorted(m.decode() for m in client.smembers(RUNS_KEY))

    def claim_tokenizer(self, sha256: str) -> str:
        """The run's tokenizer hash (diloco/tokenizer.py): the first claimed, by an island
        or syncd once it has prepared the corpus (a `train` tokenizer trained); a later
        claim leaves it and reads it back, for its claimant to compare with its own."""
        self.writer.set(self.key("tokenizer"), sha256, nx=True)
        raw = self.client.get(self.key("tokenizer"))
        return raw.decode(errors="replace")[:64] if raw else sha256

    def set_epoch(self, island: str, epoch: int) -> None:
        self.client.hset(self.key("epochs"), island, epoch)

    def epochs(self) -> dict[str, int]:
        return {k.decode(): int(v) for k, v in self.client.hgetall(self.key("epochs")).items()}

    def syncd_holder(self) -> str | None:
        """The grant of syncd's lease on the run now ("<token>:<owner>", syncd/lease.py),
        None while no syncd holds it. Every grant has a new fencing token, so a change
        tells an island that a syncd took the run over, a restarted one included."""
        raw = self.client.get(lease_key(self.run_id))
        return raw.decode() if raw else None

    def is_active(self) -> bool:
        """Whether the run is active (its key `active`, set while it is in the active set:
        started, and not yet ended, stopped or deleted). An island, its supervisor and a
        claimed standby ask before they train."""
        return bool(self.client.exists(active_key(self.run_id)))

    def raw_spec(self) -> bytes | None:
        """The spec as stored, so that syncd sees at a glance whether it changed."""
        return self.client.get(self.key("spec"))

    # -- status ----------------------------------------------------------------

    def put_status(self, status: dict[str, Any]) -> int:
        """Store the status snapshot under the next sequence number; returns it."""
        # A stale syncd may take a number (harmless: they only grow); its snapshot
        # itself is refused.
        seq = self.client.incr(self.key("status_seq"))
        self._write(lambda pipe: pipe.set(self.key("status"), json.dumps({**status, "seq": seq})))
        return seq

    def status(self) -> dict[str, Any] | None:
        raw = self.client.get(self.key("status"))
        return json.loads(raw) if raw else None

    def release(self, keep: tuple[str, ...] = KEPT_AFTER_END, linger_s: int = 60) -> int:
        """Free an ended run's keys; returns how many were deleted at once.

        Messages (update chunks, published fragments, differences, momentum: every key
        of the run on the data plane) and the update stream go at once. The small keys
        the run's last processes may still read while they stop (spec, epochs,
        commands, versions...) expire after `linger_s`. Keys named in `keep` (by their
        first part after the run's prefix) stay: the status snapshot and the logs, for
        the control room. With the run id out of the active set and its lease gone, no
        syncd publishes to it again.
        """
        self.client.srem(RUNS_KEY, self.run_id)
        bulky = ("blob", "full", "pub", "updates", "uploads", "dataplane", "active")
        deleted = 0
        if self.data is not self.client:
            deleted += _delete_matching(self.data, self.prefix + "*")
        batch: list[bytes] = []
        for key in self.client.scan_iter(match=self.prefix + "*", count=1000):
            part = key.decode()[len(self.prefix):].split(":", 1)[0]
            if part in keep:
                continue
            if part in bulky or part == "lease":
                batch.append(key)
            else:
                self.client.expire(key, linger_s)
            if len(batch) >= 1000:
                deleted += self.client.delete(*batch)
                batch = []
        if batch:
            deleted += self.client.delete(*batch)
        return deleted


def _delete_matching(client: redis.Redis, pattern: str) -> int:
    """Delete every key matching `pattern`, a thousand at a time; how many went."""
    deleted = 0
    batch: list[bytes] = []
    for key in client.scan_iter(match=pattern, count=1000):
        batch.append(key)
        if len(batch) >= 1000:
            deleted += client.delete(*batch)
            batch = []
    if batch:
        deleted += client.delete(*batch)
    return deleted
