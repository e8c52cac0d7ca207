"""Redis as the runtime's shared memory: one place that names every key.

Islands, syncd and the web app talk through these keys and nothing else. Every
value that holds tensors is a signed wire message (syncd.protocol); the rest is
small JSON. A merge is acknowledged when `publish` has committed: the new
global fragment, its version, the outer optimizer's momentum and the updates it
took in are written in one MULTI/EXEC, so a crash of syncd either loses the
whole merge (and the updates are merged again from the stream) or none of it.

Keys, for run R:
    arch:runs                      set of active run ids, for syncd
    arch:R:spec                    JSON {mode, config, secret}
    arch:R:epochs                  hash island -> current epoch (older are refused)
    arch:R:updates                 stream of {island, epoch, fragment, seq, key}
    arch:R:blob:<uuid>             an update message, with a TTL
    arch:R:versions                hash fragment -> newest global version
    arch:R:full:<p>                newest global fragment p as a full message
    arch:R:pub:<p>:<v>             published difference v-1 -> v (lossy downlink)
    arch:R:momentum:<p>            outer optimizer buffers of fragment p
    arch:R:handled:<p>             hash island -> newest seq merged or dropped
    arch:R:heartbeats              hash island -> JSON {epoch, time, step, tokens}
    arch:R:control:<island>        list of JSON commands for the island's supervisor
    arch:R:log:<island>            the last lines of the island's log, from its supervisor
    arch:R:cursor:<island>         JSON data cursor, so a rejoin goes on in its shard
    arch:R:fault:<island>          JSON {kind, until, factor}: the island's active fault
    arch:R:paused                  set while a user has paused the run
    arch:R:done                    set when the budget is spent: islands stop
    arch:R:restart                 hash {generation, until}: elastic whole-job restarts
    arch:R:rejoin                  hash island -> when a rejoin was asked for
    arch:R:checkpoint_now          set when a user asks for a checkpoint
    arch:syncd:control             list of commands for syncd ("kill")
    arch:R:status                  JSON snapshot with its sequence number
    arch:R:lease, arch:R:lease_token  which syncd serves the run, its fencing token
                                   (syncd/lease.py)
    arch:syncd:members             sorted set of live syncd processes (syncd/lease.py)

syncd's RunStore carries the run's lease (`fence`): every write it makes for the
run is one MULTI/EXEC guarded by that lease (syncd.lease.guarded_transaction), so
a syncd that lost the run to another cannot publish, mark or trim anything.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import redis
from redis.backoff import ExponentialBackoff
from redis.client import Pipeline
from redis.retry import Retry

from syncd.lease import Lease, guarded_transaction

BLOB_TTL_S = 3600
LOG_TTL_S = 7 * 24 * 3600
# About 8 s of retries with backoff: time for a Redis to restart and load its data.
RESTART_RETRIES = 12
STREAM_MAXLEN = 100_000


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
    key: bytes


class RunStore:
    """The Redis keys of one run.

    Args:
        client: a connection from `connect`.
        run_id: the run's primary key.
        fence: syncd's lease on the run; when given, every write syncd makes for the
            run (publish, handled seqs, trims, status, completion, restarts) commits
            only while this lease is current, and raises syncd.lease.LeaseLost if not.
            The web app and islands pass none.
    """

    def __init__(self, client: redis.Redis, run_id: int | str, fence: Lease | None = None):
        self.r = client
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

    def push_update(self, island: str, epoch: int, fragment: int, seq: int, blob: bytes) -> None:
        """Store an update message with a TTL and reference it from the stream."""
        blob_key = self.key("blob", uuid.uuid4().hex)
        pipe = self.r.pipeline(transaction=True)
        pipe.set(blob_key, blob, ex=BLOB_TTL_S)
        pipe.xadd(self.key("updates"), {"island": island, "epoch": epoch, "fragment": fragment,
                                        "seq": seq, "key": blob_key},
                  maxlen=STREAM_MAXLEN, approximate=True)
        pipe.execute()

    def read_updates(self, after: bytes = b"0-0", count: int = 64, block_ms: int | None = None
                     ) -> list[UpdateRef]:
        reply = self.r.xread({self.key("updates"): after}, count=count, block=block_ms)
        refs = []
        for _, entries in reply or []:
            for stream_id, f in entries:
                refs.append(UpdateRef(stream_id, f[b"island"].decode(), int(f[b"epoch"]),
                                      int(f[b"fragment"]), int(f[b"seq"]), f[b"key"]))
        return refs

    def blob(self, key: bytes) -> bytes | None:
        return self.r.get(key)

    def trim_updates(self, min_id: bytes) -> None:
        """Forget stream entries older than `min_id`: all of them are handled."""
        self._write(lambda pipe: pipe.xtrim(self.key("updates"), minid=min_id))

    # -- globals: syncd -> islands -------------------------------------------

    def publish(self, fragment: int, version: int, full: bytes, diff: bytes | None,
                momentum: bytes, handled: dict[str, int], tokens: int, keep: int) -> None:
        """Commit one merge: the new version, its messages, momentum and handled seqs.

        Raises:
            syncd.lease.LeaseLost: this store's lease is gone; nothing was published.
        """
        def fill(pipe: Pipeline) -> None:
            pipe.set(self.key("full", fragment), full)
            if diff is not None:
                pipe.set(self.key("pub", fragment, version), diff)
                pipe.delete(self.key("pub", fragment, version - keep))
            pipe.set(self.key("momentum", fragment), momentum)
            if handled:
                pipe.hset(self.key("handled", fragment), mapping=handled)
            pipe.hset(self.key("versions"), fragment, version)
            pipe.hincrby(self.key("tokens_merged"), fragment, tokens)

        self._write(fill)

    def mark_handled(self, fragment: int, handled: dict[str, int]) -> None:
        if handled:
            self._write(lambda pipe: pipe.hset(self.key("handled", fragment), mapping=handled))

    def versions(self) -> dict[int, int]:
        return {int(k): int(v) for k, v in self.r.hgetall(self.key("versions")).items()}

    def handled(self, fragment: int) -> dict[str, int]:
        raw = self.r.hgetall(self.key("handled", fragment))
        return {k.decode(): int(v) for k, v in raw.items()}

    def full(self, fragment: int) -> bytes | None:
        return self.r.get(self.key("full", fragment))

    def diffs(self, fragment: int, versions: Iterable[int]) -> list[bytes | None]:
        return self.r.mget([self.key("pub", fragment, v) for v in versions])

    def momentum(self, fragment: int) -> bytes | None:
        return self.r.get(self.key("momentum", fragment))

    def tokens_merged(self) -> dict[int, int]:
        """Tokens behind the updates merged into each fragment."""
        raw = self.r.hgetall(self.key("tokens_merged"))
        return {int(k): int(v) for k, v in raw.items()}

    def mark_done(self) -> None:
        """The budget is spent: islands stop at their next step."""
        self._write(lambda pipe: pipe.set(self.key("done"), 1))

    # -- heartbeats, commands, cursors, status -------------------------------

    def heartbeat(self, island: str, epoch: int, step: int, tokens: int, **extra: Any) -> None:
        beat = {"epoch": epoch, "time": time.time(), "step": step, "tokens": tokens, **extra}
        self.r.hset(self.key("heartbeats"), island, json.dumps(beat))

    def heartbeats(self) -> dict[str, dict[str, Any]]:
        raw = self.r.hgetall(self.key("heartbeats"))
        return {k.decode(): json.loads(v) for k, v in raw.items()}

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
        """Elastic: ask every island to roll back and pause until `until`; returns the
        restart's generation number."""
        def fill(pipe: Pipeline) -> None:
            pipe.hincrby(self.key("restart"), "generation", 1)
            pipe.hset(self.key("restart"), "until", until)

        return int(self._write(fill)[0])

    def restart(self) -> tuple[int, float]:
        raw = self.r.hgetall(self.key("restart"))
        return int(raw.get(b"generation", 0)), float(raw.get(b"until", 0.0))

    def rejoin_requested(self, island: str, at: float) -> None:
        self.r.hset(self.key("rejoin"), island, at)

    def rejoin_requests(self) -> dict[str, float]:
        """Open rejoin requests: island -> when it was asked for."""
        return {k.decode(): float(v) for k, v in self.r.hgetall(self.key("rejoin")).items()}

    def close_rejoin_request(self, island: str) -> None:
        self._write(lambda pipe: pipe.hdel(self.key("rejoin"), island))

    def faults(self, islands: list[str]) -> dict[str, str]:
        """island -> kind of its active fault (straggle, partition, degrade, corrupt)."""
        if not islands:
            return {}
        values = self.r.mget([self.key("fault", i) for i in islands])
        now = time.time()
        active = {i: json.loads(v) for i, v in zip(islands, values, strict=True) if v}
        return {i: f["kind"] for i, f in active.items() if f.get("until", 0) > now}

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
