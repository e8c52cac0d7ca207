"""Redis as the runtime's shared memory: the front over one run's keys.

`RunStore` is what a process holds for a run. It is made of the run's parts,
each a module of one idea that a consumer can depend on alone:
syncd.update_stream (islands -> syncd), syncd.globals_store (syncd -> islands),
syncd.island_signals (heartbeats, deaths, logs, commands, cursors, faults); this
module adds the run itself: its spec and membership, the control flags a user
sets (pause, stop, checkpoint, rejoin), elastic restarts, the chaos schedule's
progress, the status snapshot, and the release of an ended run's keys.
syncd.keys names every key.

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
from syncd.globals_store import GlobalsStore
from syncd.island_signals import IslandSignals
from syncd.keys import RUNS_KEY, active_key, lease_key
from syncd.update_stream import UpdateStream

# What stays of a run that ended, for the control room: its last status and the logs.
KEPT_AFTER_END = ("status", "status_seq", "log")


class RunStore(UpdateStream, GlobalsStore, IslandSignals):
    """The Redis keys of one run: its update stream, published globals and island
    signals (the parts it is made of), and the run's own keys.

    Args: those of syncd.run_keys.RunKeys.
    """

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

    # -- the run's flags, restarts and status --------------------------------

    def mark_done(self) -> None:
        """The budget is spent: islands stop at their next step."""
        self._write(lambda pipe: pipe.set(self.key("done"), 1))

    def done(self) -> bool:
        return bool(self.client.exists(self.key("done")))

    def restart_job(self, until: float) -> int:
        """Elastic: ask every island to roll back and pause until `until`; returns how
        many restarts the run has had, this one included (the field `generation`)."""
        def fill(pipe: Pipeline) -> None:
            pipe.hincrby(self.key("restart"), "generation", 1)
            pipe.hset(self.key("restart"), "until", until)

        return int(self._write(fill)[0])

    def restart(self) -> tuple[int, float]:
        """(restarts so far, the pause's end) of the run's last whole-job restart."""
        raw = self.client.hgetall(self.key("restart"))
        return int(raw.get(b"generation", 0)), float(raw.get(b"until", 0.0))

    def request_rejoin(self, island: str, at: float) -> None:
        self.client.hset(self.key("rejoin"), island, at)

    def rejoin_requests(self) -> dict[str, float]:
        """Open rejoin requests: island -> when it was asked for."""
        return {k.decode(): float(v) for k, v in self.client.hgetall(self.key("rejoin")).items()}

    def close_rejoin_request(self, island: str) -> None:
        self._write(lambda pipe: pipe.hdel(self.key("rejoin"), island))

    def request_stop(self, at: float) -> None:
        """A user stops the run at `at`: syncd finishes it (syncd/service.py)."""
        self.client.set(self.key("stop"), at, nx=True)

    def stop_requested(self) -> float | None:
        """When a stop was asked for, or None."""
        raw = self.client.get(self.key("stop"))
        return None if raw is None else float(raw)

    def request_checkpoint(self) -> None:
        self.client.set(self.key("checkpoint_now"), 1)

    def take_checkpoint_request(self) -> bool:
        """Whether a checkpoint was asked for since the last call."""
        return bool(self._write(lambda pipe: pipe.delete(self.key("checkpoint_now")))[0])

    def set_paused(self, paused: bool) -> None:
        if paused:
            self.client.set(self.key("paused"), 1)
        else:
            self.client.delete(self.key("paused"))

    def paused(self) -> bool:
        return bool(self.client.exists(self.key("paused")))

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

    def chaos_progress(self) -> dict[str, str]:
        """How far syncd got with the run's chaos schedule: {start, done, islands}
        (islands as JSON), {} before the schedule's clock started."""
        raw = self.client.hgetall(self.key("chaos"))
        return {k.decode(): v.decode() for k, v in raw.items()}

    def start_chaos(self, start: float, islands: dict[str, str]) -> None:
        """The schedule's clock starts at `start`, over `islands` (name -> region)."""
        self.client.hset(self.key("chaos"), mapping={"start": start, "done": 0,
                                                "islands": json.dumps(islands)})

    def set_chaos_done(self, done: int) -> None:
        """The first `done` actions of the chaos schedule are carried out."""
        self.client.hset(self.key("chaos"), "done", done)

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
