"""Redis as the runtime's shared memory: one place that names every key.

Islands, syncd and the web app talk through these keys and nothing else. Every
value that holds tensors is a signed wire message (diloco.protocol); the rest is
small JSON. A merge is acknowledged when `publish` has committed: the new
global fragment, its version, the outer optimizer's momentum and the updates it
took in are written in one MULTI/EXEC, so a crash of syncd either loses the
whole merge (and the updates are merged again from the stream) or none of it.

Messages that carry tensors are stored in chunks (syncd.bulk): the key named
below holds a reference {key, chunks, size} and the bytes lie in `<key>:<i>`.

Keys, for run R:
    arch:runs                      set of active run ids, for syncd
    arch:R:spec                    JSON {mode, config, secret}
    arch:R:epochs                  hash island -> current epoch (older are refused)
    arch:R:updates                 stream of {island, epoch, fragment, seq, key, chunks,
                                   bytes}
    arch:R:blob:<uuid>:<i>         chunks of an update message, with a TTL, deleted once
                                   syncd merged, refused or dropped it
    arch:R:versions                hash fragment -> newest global version
    arch:R:full:<p>                reference to the newest global fragment p (a full
                                   message in arch:R:full:<p>:<v>:<i>)
    arch:R:pub:<p>:<v>             reference to the published difference v-1 -> v
                                   (lossy downlink; the last max_staleness are kept)
    arch:R:momentum:<p>            reference to the outer optimizer buffers of fragment p
                                   (arch:R:momentum:<p>:<v>:<i>)
    arch:R:tokens_merged           hash fragment -> tokens behind its merged updates
    arch:R:handled:<p>             hash island -> newest seq merged or dropped
    arch:R:heartbeats              hash island -> JSON {epoch, time, step, tokens}
    arch:R:deaths                  hash island -> JSON {epoch, time, exit_code, signal}: the
                                   death of an island process, from its supervisor
    arch:R:control:<island>        list of JSON commands for the island's supervisor
    arch:R:log:<island>            the last lines of the island's log, from its supervisor
    arch:R:cursor:<island>         JSON data cursor, so a rejoin goes on in its shard
    arch:R:fault:<island>          JSON {kind, until, factor}: the island's active fault
    arch:R:paused                  set while a user has paused the run
    arch:R:done                    set when the budget is spent: islands stop
    arch:R:stop                    when a user asked to stop the run: syncd merges what
                                   arrives, checkpoints, and ends the run
    arch:R:restart                 hash {generation, until}: elastic whole-job restarts
    arch:R:rejoin                  hash island -> when a rejoin was asked for
    arch:R:checkpoint_now          set when a user asks for a checkpoint
    arch:syncd:control             list of commands for syncd ("kill")
    arch:R:status                  JSON snapshot with its sequence number
    arch:R:status_seq              the snapshots' sequence counter
    arch:R:lease, arch:R:lease_token  which syncd serves the run, its fencing token
                                   (syncd/lease.py)
    arch:syncd:members             sorted set of syncd processes alive (syncd/lease.py)

Keys of the hosts' pools of warm standby islands (PoolStore, trainer/pool_manager.py):
    arch:pool:<region>:claims      list of JSON claims {run, island, epoch, asked_at} for
                                   the region's pool managers, pushed by the run services
    arch:pool:<region>:hosts       hash host -> JSON {size, ready, launching, claimed,
                                   standbys, time}: each manager's pool, every half second

syncd's RunStore carries the run's lease (`fence`): every write it makes for the
run is one MULTI/EXEC guarded by that lease (syncd.fence.guarded_transaction), so
a syncd that lost the run to another cannot publish, mark or trim anything.

When a run ends (`release`), its keys go but its status snapshot and the
islands' log lines, which the control room shows for a finished run.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import redis
from redis.backoff import ExponentialBackoff
from redis.client import Pipeline
from redis.retry import Retry

from syncd.bulk import BulkError, BulkRef, RedisBulk
from syncd.fence import Lease, guarded_transaction

# A backstop for chunks nobody reads (an island that died between its chunks and its
# stream entry, a syncd that died before its publish committed): syncd deletes every
# update message it is done with and persists what it publishes.
BLOB_TTL_S = 3600
LOG_TTL_S = 7 * 24 * 3600
# About 8 s of retries with backoff: time for a Redis to restart and load its data.
RESTART_RETRIES = 12
STREAM_MAXLEN = 100_000
# What stays of a run that ended, for the control room: its last status and the logs.
KEPT_AFTER_END = ("status", "status_seq", "log")
READ_TRIES = 5  # a reference read just before its message was replaced is read again


SYNCD_MEMBERS_KEY = "arch:syncd:members"


def lease_key(run_id: int | str) -> str:
    """The key of a run's lease: "<token>:<owner>" of the syncd serving it."""
    return f"arch:{run_id}:lease"


def lease_token_key(run_id: int | str) -> str:
    """The counter that numbers the grants of a run's lease (the fencing tokens)."""
    return f"arch:{run_id}:lease_token"


def kill_syncd(client: redis.Redis) -> None:
    """Ask syncd to SIGKILL itself (a fault for admins); works wherever it runs."""
    client.rpush("arch:syncd:control", "kill")


def syncd_command(client: redis.Redis) -> str | None:
    raw = client.lpop("arch:syncd:control")
    return raw.decode() if raw else None


def connect(url: str, *, ride_out_restarts: bool = False) -> redis.Redis:
    """A binary-safe client; every caller decodes what it reads itself.

    Args:
        url: redis:// or rediss:// URL, password included.
        ride_out_restarts: retry a command for a few seconds when the connection drops
            (a Redis restarting and loading its append-only file). For islands, whose
            writes are idempotent for syncd (an update is known by its seq); not for
            syncd, whose merge transaction must not run twice.
    """
    if not ride_out_restarts:
        return redis.Redis.from_url(url, decode_responses=False, health_check_interval=30)
    return redis.Redis.from_url(
        url, decode_responses=False, health_check_interval=30,
        retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), RESTART_RETRIES),
        retry_on_error=[redis.ConnectionError, redis.TimeoutError, ConnectionResetError,
                        redis.BusyLoadingError])


@dataclass(frozen=True)
class UpdateRef:
    stream_id: bytes
    island: str
    epoch: int
    fragment: int
    seq: int
    blob: BulkRef


class RunStore:
    """The Redis keys of one run.

    Args:
        client: a connection from `connect`.
        run_id: the run's primary key.
        fence: syncd's lease on the run; when given, every write syncd makes for the
            run (publish, handled seqs, trims, status, completion, restarts) commits
            only while this lease is current, and raises syncd.fence.LeaseLost if not.
            The web app and islands pass none.
    """

    def __init__(self, client: redis.Redis, run_id: int | str, fence: Lease | None = None,
                 chunk_bytes: int | None = None):
        self.r = client
        self.bulk = RedisBulk(client, chunk_bytes)
        self.run_id = str(run_id)
        self.prefix = f"arch:{run_id}:"
        if fence is not None and fence.run_id != self.run_id:
            raise ValueError(f"the lease is for run {fence.run_id}, not run {self.run_id}")
        self.fence = fence

    def key(self, *parts: object) -> str:
        return self.prefix + ":".join(str(p) for p in parts)

    def _write(self, fill: Callable[[Pipeline], object]) -> list:
        """One MULTI/EXEC of the commands `fill` queues, fenced by the lease if any."""
        if self.fence is not None:
            return guarded_transaction(self.r, self.fence, fill)
        pipe = self.r.pipeline(transaction=True)
        fill(pipe)
        return pipe.execute()

    # -- run spec and membership ---------------------------------------------

    def put_spec(self, mode: str, config: dict[str, Any], secret: str,
                 initial_checkpoint: dict[str, str] | None = None) -> None:
        """What the processes of a run read: mode, config, secret, and the checkpoint
        ({"path", "sha256"}) its global model starts from, if any."""
        spec = {"mode": mode, "config": config, "secret": secret}
        if initial_checkpoint:
            spec["initial_checkpoint"] = initial_checkpoint
        self.r.set(self.key("spec"), json.dumps(spec))
        self.r.sadd("arch:runs", self.run_id)

    def spec(self) -> dict[str, Any] | None:
        raw = self.r.get(self.key("spec"))
        return json.loads(raw) if raw else None

    def deactivate(self) -> None:
        self._write(lambda pipe: pipe.srem("arch:runs", self.run_id))

    @staticmethod
    def active_runs(client: redis.Redis) -> list[str]:
        return sorted(m.decode() for m in client.smembers("arch:runs"))

    def set_epoch(self, island: str, epoch: int) -> None:
        self.r.hset(self.key("epochs"), island, epoch)

    def epochs(self) -> dict[str, int]:
        return {k.decode(): int(v) for k, v in self.r.hgetall(self.key("epochs")).items()}

    # -- updates: islands -> syncd -------------------------------------------

    def push_update(self, island: str, epoch: int, fragment: int, seq: int,
                    blob: bytes | bytearray) -> None:
        """Store an update message in chunks with a TTL, then reference it from the
        stream (in that order, so syncd never reads an entry before its chunks)."""
        pipe = self.r.pipeline(transaction=False)
        ref = self.bulk.put(self.key("blob", uuid.uuid4().hex), blob, BLOB_TTL_S, pipe)
        pipe.xadd(self.key("updates"), {"island": island, "epoch": epoch, "fragment": fragment,
                                        "seq": seq, "key": ref.key, "chunks": ref.chunks,
                                        "bytes": ref.size},
                  maxlen=STREAM_MAXLEN, approximate=True)
        pipe.execute()

    def read_updates(self, after: bytes = b"0-0", count: int = 64, block_ms: int | None = None
                     ) -> list[UpdateRef]:
        reply = self.r.xread({self.key("updates"): after}, count=count, block=block_ms)
        refs = []
        for _, entries in reply or []:
            for stream_id, f in entries:
                blob = BulkRef(f[b"key"].decode(), int(f[b"chunks"]), int(f[b"bytes"]))
                refs.append(UpdateRef(stream_id, f[b"island"].decode(), int(f[b"epoch"]),
                                      int(f[b"fragment"]), int(f[b"seq"]), blob))
        return refs

    def update_message(self, ref: UpdateRef, max_bytes: int) -> bytearray:
        """The update message a stream entry names.

        Raises:
            syncd.bulk.BulkError: too large, expired, missing or incomplete.
        """
        return self.bulk.read(ref.blob, max_bytes)

    def drop_updates(self, refs: Iterable[UpdateRef]) -> None:
        """Delete the messages of updates syncd refused or threw away."""
        refs = list(refs)
        if refs:
            self._write(lambda pipe: [self.bulk.delete(pipe, ref.blob) for ref in refs])

    def trim_updates(self, min_id: bytes) -> None:
        """Forget stream entries older than `min_id`: all of them are handled."""
        self._write(lambda pipe: pipe.xtrim(self.key("updates"), minid=min_id))

    # -- globals: syncd -> islands -------------------------------------------

    def publish(self, fragment: int, version: int, full: bytes | bytearray,
                diff: bytes | bytearray | None, momentum: bytes | bytearray,
                handled: dict[str, int], tokens: int, keep: int,
                merged: Iterable[UpdateRef] = ()) -> None:
        """Commit one merge: the new version, its messages, momentum and handled seqs,
        and the deletion of the merged updates' messages.

        The messages' chunks are written first, with a TTL, and made persistent by the
        MULTI/EXEC that commits the merge; it also deletes the version before (an
        island that was reading it reads the new one: `full`) and, with a lossy
        downlink, the difference `keep` versions back. So between the two steps one
        fragment is held twice, and never more.

        Raises:
            syncd.fence.LeaseLost: this store's lease is gone; nothing was published.
        """
        pipe = self.r.pipeline(transaction=False)
        full_ref = self.bulk.put(self.key("full", fragment, version), full, BLOB_TTL_S, pipe)
        momentum_ref = self.bulk.put(self.key("momentum", fragment, version), momentum,
                                     BLOB_TTL_S, pipe)
        diff_ref = None if diff is None else self.bulk.put(
            self.key("pub", fragment, version), diff, BLOB_TTL_S, pipe)
        pipe.execute()
        merged = list(merged)

        def fill(pipe: Pipeline) -> None:
            for ref, name in ((full_ref, "full"), (momentum_ref, "momentum")):
                self.bulk.persist(pipe, ref)
                pipe.set(self.key(name, fragment), ref.dumps())
                self.bulk.delete(pipe, BulkRef(self.key(name, fragment, version - 1),
                                               ref.chunks, 0), spare=1)
            if diff_ref is not None:
                self.bulk.persist(pipe, diff_ref)
                pipe.set(self.key("pub", fragment, version), diff_ref.dumps())
                old = self.key("pub", fragment, version - keep)
                pipe.delete(old)
                self.bulk.delete(pipe, BulkRef(old, diff_ref.chunks, 0), spare=1)
            if handled:
                pipe.hset(self.key("handled", fragment), mapping=handled)
            pipe.hset(self.key("versions"), fragment, version)
            pipe.hincrby(self.key("tokens_merged"), fragment, tokens)
            for ref in merged:
                self.bulk.delete(pipe, ref.blob)

        self._write(fill)

    def mark_handled(self, fragment: int, handled: dict[str, int],
                     dropped: Iterable[UpdateRef] = ()) -> None:
        """Record seqs syncd is done with, and delete the messages of `dropped`."""
        dropped = list(dropped)
        if not handled and not dropped:
            return

        def fill(pipe: Pipeline) -> None:
            if handled:
                pipe.hset(self.key("handled", fragment), mapping=handled)
            for ref in dropped:
                self.bulk.delete(pipe, ref.blob)

        self._write(fill)

    def versions(self) -> dict[int, int]:
        return {int(k): int(v) for k, v in self.r.hgetall(self.key("versions")).items()}

    def handled(self, fragment: int) -> dict[str, int]:
        raw = self.r.hgetall(self.key("handled", fragment))
        return {k.decode(): int(v) for k, v in raw.items()}

    def handled_seq(self, fragment: int, island: str) -> int:
        """The newest seq of the island's updates of `fragment` syncd is done with."""
        raw = self.r.hget(self.key("handled", fragment), island)
        return -1 if raw is None else int(raw)

    def _read(self, pointer: str, max_bytes: int) -> bytearray | None:
        """The message a reference key names; None if there is none. A reference read
        just before a newer message replaced it is read again."""
        for attempt in range(READ_TRIES):
            raw = self.r.get(pointer)
            if raw is None:
                return None
            try:
                return self.bulk.read(BulkRef.loads(raw), max_bytes)
            except BulkError:
                if attempt == READ_TRIES - 1:
                    raise
        return None

    def full(self, fragment: int, max_bytes: int = 1 << 40) -> bytearray | None:
        """The newest global fragment as a full message."""
        return self._read(self.key("full", fragment), max_bytes)

    def differences(self, fragment: int, versions: Iterable[int], max_bytes: int = 1 << 40
              ) -> list[bytearray | None]:
        """The published differences to these versions (None where one is gone)."""
        out: list[bytearray | None] = []
        for v in versions:
            try:
                out.append(self._read(self.key("pub", fragment, v), max_bytes))
            except BulkError:
                out.append(None)
        return out

    def momentum(self, fragment: int, max_bytes: int = 1 << 40) -> bytearray | None:
        return self._read(self.key("momentum", fragment), max_bytes)

    def tokens_merged(self) -> dict[int, int]:
        """Tokens behind the updates merged into each fragment."""
        raw = self.r.hgetall(self.key("tokens_merged"))
        return {int(k): int(v) for k, v in raw.items()}

    def mark_done(self) -> None:
        """The budget is spent: islands stop at their next step."""
        self._write(lambda pipe: pipe.set(self.key("done"), 1))

    def done(self) -> bool:
        return bool(self.r.exists(self.key("done")))

    def release(self, keep: tuple[str, ...] = KEPT_AFTER_END, linger_s: int = 60) -> int:
        """Free an ended run's keys; returns how many were deleted at once.

        Messages (update chunks, published fragments, differences, momentum) and the
        update stream go at once. The small keys the run's last processes may still
        read while they stop (spec, epochs, commands, versions...) expire after
        `linger_s`. Keys named in `keep` (by their first part after the run's prefix)
        stay: the status snapshot and the logs, for the control room. With the run
        id out of the active set and its lease gone, no syncd publishes to it again.
        """
        self.r.srem("arch:runs", self.run_id)
        bulky = ("blob", "full", "pub", "momentum", "updates")
        deleted = 0
        batch: list[bytes] = []
        for key in self.r.scan_iter(match=self.prefix + "*", count=1000):
            part = key.decode()[len(self.prefix):].split(":", 1)[0]
            if part in keep:
                continue
            if part in bulky or part == "lease":
                batch.append(key)
            else:
                self.r.expire(key, linger_s)
            if len(batch) >= 1000:
                deleted += self.r.delete(*batch)
                batch = []
        if batch:
            deleted += self.r.delete(*batch)
        return deleted

    # -- heartbeats, commands, cursors, status -------------------------------

    def heartbeat(self, island: str, epoch: int, step: int, tokens: int, **extra: Any) -> None:
        beat = {"epoch": epoch, "time": time.time(), "step": step, "tokens": tokens, **extra}
        self.r.hset(self.key("heartbeats"), island, json.dumps(beat))

    def heartbeats(self) -> dict[str, dict[str, Any]]:
        raw = self.r.hgetall(self.key("heartbeats"))
        return {k.decode(): json.loads(v) for k, v in raw.items()}

    def report_death(self, island: str, epoch: int, exit_code: int | None,
                     at: float | None = None) -> None:
        """The island's process of `epoch` is dead (from its supervisor, which saw it
        end): syncd marks the island lost at once instead of after its heartbeat
        timeout. `exit_code` is the process's: negative for the signal that killed it."""
        death = {"epoch": epoch, "time": time.time() if at is None else at,
                 "exit_code": exit_code,
                 "signal": -exit_code if exit_code is not None and exit_code < 0 else None}
        self.r.hset(self.key("deaths"), island, json.dumps(death))

    def deaths(self) -> dict[str, dict[str, Any]]:
        """island -> the last death its supervisor reported."""
        raw = self.r.hgetall(self.key("deaths"))
        return {k.decode(): json.loads(v) for k, v in raw.items()}

    def epochs_and_deaths(self) -> tuple[dict[str, int], dict[str, dict[str, Any]]]:
        """`epochs()` and `deaths()` in one round trip (syncd reads both every pass)."""
        pipe = self.r.pipeline(transaction=False)
        pipe.hgetall(self.key("epochs"))
        pipe.hgetall(self.key("deaths"))
        epochs, deaths = pipe.execute()
        return ({k.decode(): int(v) for k, v in epochs.items()},
                {k.decode(): json.loads(v) for k, v in deaths.items()})

    def put_log(self, island: str, lines: list[str]) -> None:
        """The last lines of an island's log, so the control room shows them whatever
        host the island runs on."""
        self.r.set(self.key("log", island), json.dumps(lines), ex=LOG_TTL_S)

    def log(self, island: str) -> list[str] | None:
        raw = self.r.get(self.key("log", island))
        return json.loads(raw) if raw else None

    def send_command(self, island: str, kind: str, **args: Any) -> None:
        self.r.rpush(self.key("control", island), json.dumps({"kind": kind, **args}))

    def next_command(self, island: str) -> dict[str, Any] | None:
        raw = self.r.lpop(self.key("control", island))
        return json.loads(raw) if raw else None

    def save_cursor(self, island: str, cursor: dict[str, Any]) -> None:
        self.r.set(self.key("cursor", island), json.dumps(cursor))

    def cursor(self, island: str) -> dict[str, Any] | None:
        raw = self.r.get(self.key("cursor", island))
        return json.loads(raw) if raw else None

    def restart_job(self, until: float) -> int:
        """Elastic: ask every island to roll back and pause until `until`; returns how
        many restarts the run has had, this one included (the field `generation`)."""
        def fill(pipe: Pipeline) -> None:
            pipe.hincrby(self.key("restart"), "generation", 1)
            pipe.hset(self.key("restart"), "until", until)

        return int(self._write(fill)[0])

    def restart(self) -> tuple[int, float]:
        """(restarts so far, the pause's end) of the run's last whole-job restart."""
        raw = self.r.hgetall(self.key("restart"))
        return int(raw.get(b"generation", 0)), float(raw.get(b"until", 0.0))

    def rejoin_requested(self, island: str, at: float) -> None:
        self.r.hset(self.key("rejoin"), island, at)

    def rejoin_requests(self) -> dict[str, float]:
        """Open rejoin requests: island -> when it was asked for."""
        return {k.decode(): float(v) for k, v in self.r.hgetall(self.key("rejoin")).items()}

    def close_rejoin_request(self, island: str) -> None:
        self._write(lambda pipe: pipe.hdel(self.key("rejoin"), island))

    def fault(self, island: str) -> dict[str, Any]:
        """The island's active fault ({kind, until, factor}), or {} if none."""
        raw = self.r.get(self.key("fault", island))
        fault = json.loads(raw) if raw else {}
        return fault if fault.get("until", 0) > time.time() else {}

    def clear_fault(self, island: str) -> None:
        self.r.delete(self.key("fault", island))

    def faults(self, islands: list[str]) -> dict[str, str]:
        """island -> kind of its active fault (straggle, partition, degrade, corrupt)."""
        if not islands:
            return {}
        values = self.r.mget([self.key("fault", i) for i in islands])
        now = time.time()
        active = {i: json.loads(v) for i, v in zip(islands, values, strict=True) if v}
        return {i: f["kind"] for i, f in active.items() if f.get("until", 0) > now}

    def request_stop(self, at: float) -> None:
        """A user stops the run at `at`: syncd finishes it (syncd/service.py)."""
        self.r.set(self.key("stop"), at, nx=True)

    def stop_requested(self) -> float | None:
        """When a stop was asked for, or None."""
        raw = self.r.get(self.key("stop"))
        return None if raw is None else float(raw)

    def request_checkpoint(self) -> None:
        self.r.set(self.key("checkpoint_now"), 1)

    def take_checkpoint_request(self) -> bool:
        """Whether a checkpoint was asked for since the last call."""
        return bool(self._write(lambda pipe: pipe.delete(self.key("checkpoint_now")))[0])

    def set_paused(self, paused: bool) -> None:
        if paused:
            self.r.set(self.key("paused"), 1)
        else:
            self.r.delete(self.key("paused"))

    def paused(self) -> bool:
        return bool(self.r.exists(self.key("paused")))

    def put_status(self, status: dict[str, Any]) -> int:
        """Store the status snapshot under the next sequence number; returns it."""
        # A stale syncd may take a number (harmless: they only grow); its snapshot
        # itself is refused.
        seq = self.r.incr(self.key("status_seq"))
        self._write(lambda pipe: pipe.set(self.key("status"), json.dumps({**status, "seq": seq})))
        return seq

    def status(self) -> dict[str, Any] | None:
        raw = self.r.get(self.key("status"))
        return json.loads(raw) if raw else None

    # -- syncd's watch of the run: its spec, its stream, its chaos schedule ---

    def raw_spec(self) -> bytes | None:
        """The spec as stored, so that syncd sees at a glance whether it changed."""
        return self.r.get(self.key("spec"))

    def newest_update_id(self) -> bytes | None:
        """The id of the newest entry in the update stream, None while it is empty."""
        newest = self.r.xrevrange(self.key("updates"), count=1)
        return newest[0][0] if newest else None

    def chaos_progress(self) -> dict[str, str]:
        """How far syncd got with the run's chaos schedule: {start, done, islands}
        (islands as JSON), {} before the schedule's clock started."""
        raw = self.r.hgetall(self.key("chaos"))
        return {k.decode(): v.decode() for k, v in raw.items()}

    def start_chaos(self, start: float, islands: dict[str, str]) -> None:
        """The schedule's clock starts at `start`, over `islands` (name -> region)."""
        self.r.hset(self.key("chaos"), mapping={"start": start, "done": 0,
                                                "islands": json.dumps(islands)})

    def chaos_done(self, done: int) -> None:
        """The first `done` actions of the chaos schedule are carried out."""
        self.r.hset(self.key("chaos"), "done", done)

    def set_fault(self, island: str, kind: str, until: float, factor: float,
                  seconds: float) -> None:
        """The island's active fault, which it reads and acts out until `until`. The key
        outlives the fault a little, so the island reads its end from "until" rather
        than from the key vanishing mid-read; then Redis forgets it."""
        self.r.set(self.key("fault", island),
                   json.dumps({"kind": kind, "until": until, "factor": factor}),
                   ex=math.ceil(seconds) + 60)

    def is_active(self) -> bool:
        """Whether the run is in the active set: started, and not yet ended, stopped or
        deleted. An island, its supervisor and a claimed standby ask before they train."""
        return bool(self.r.sismember("arch:runs", self.run_id))


class PoolStore:
    """The keys of the hosts' pools of warm standby islands (not of one run).

    Args:
        client: a connection from `connect`.
        fresh_s: a host's announcement older than this is not believed.
    """

    def __init__(self, client: redis.Redis, fresh_s: float = 3.0):
        self.r = client
        self.fresh_s = fresh_s

    @staticmethod
    def key(region: str, part: str) -> str:
        return f"arch:pool:{region}:{part}"

    def push_claim(self, region: str, claim: dict[str, Any]) -> None:
        """Ask the region's pool managers to start an island; they take claims in order."""
        self.r.rpush(self.key(region, "claims"), json.dumps(claim))

    def take_claims(self, region: str, timeout_s: float) -> list[dict[str, Any]]:
        """Every claim waiting (waiting up to `timeout_s` for the first); [] if none."""
        first = self.r.blpop([self.key(region, "claims")], timeout=timeout_s)
        if first is None:
            return []
        raw = [first[1]]
        while (more := self.r.lpop(self.key(region, "claims"))) is not None:
            raw.append(more)
        claims = []
        for item in raw:
            try:
                claims.append(json.loads(item))
            except ValueError:
                claims.append({"unreadable": item.decode(errors="replace")})
        return claims

    def put_host(self, region: str, host: str, state: dict[str, Any]) -> None:
        self.r.hset(self.key(region, "hosts"), host, json.dumps(state))

    def remove_host(self, region: str, host: str) -> None:
        self.r.hdel(self.key(region, "hosts"), host)

    def hosts(self, region: str, now: float | None = None) -> dict[str, dict[str, Any]]:
        """The region's pool managers that announced themselves in the last `fresh_s`."""
        now = time.time() if now is None else now
        raw = self.r.hgetall(self.key(region, "hosts"))
        states = {k.decode(): json.loads(v) for k, v in raw.items()}
        return {h: s for h, s in states.items() if now - s.get("time", 0) <= self.fresh_s}

    def ready(self, region: str, now: float | None = None) -> int:
        """Standbys ready in the region, as its pool managers last said."""
        return sum(int(s.get("ready", 0)) for s in self.hosts(region, now).values())
