"""The keys of one run and its writes: what the parts of syncd.store.RunStore share.

A run's keys live on two Redis: the control Redis (durable: spec, epochs, versions,
handled seqs, references, leases, heartbeats, status; the Celery broker and the
channel layer share it) and the data plane (`data`: the chunks of tensor messages,
updates in flight, a lossy downlink's differences and, unless syncd serves them
from its files (`served`), published fragments, kept nowhere on disk). With no data
plane configured, both are the one Redis.

syncd's stores carry the run's lease (`fence`): every write they make for the run
on the control Redis is one MULTI/EXEC guarded by that lease
(syncd.fence.guarded_transaction), so a syncd that lost the run to another cannot
publish, mark or trim anything. Chunks on the data plane are named by their writer
(syncd.globals_store), so an unfenced chunk write never touches another's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

import redis
from redis.client import Pipeline

from syncd.bulk import RedisBulk, Served
from syncd.fence import Lease, guarded_transaction
from syncd.keys import run_prefix

log = logging.getLogger("archipelago.syncd")

# A backstop for chunks nobody reads (an island that died between its chunks and its
# stream entry, a syncd that died before its publish committed): syncd deletes every
# update message it is done with and persists what it publishes.
BLOB_TTL_S = 3600
# How often an island's own write is tried again over a key an island (with the run's
# credential) keeps making another type; then the error is the island's.
OWN_WRITE_TRIES = 5
T = TypeVar("T")


class RunKeys:
    """The Redis keys of one run (syncd.keys names them all).

    Args:
        client: a connection from syncd.connection.connect.
        run_id: the run's primary key.
        fence: syncd's lease on the run; when given, every write syncd makes for the
            run (publish, handled seqs, trims, status, completion, restarts) commits
            only while this lease is current, and raises syncd.fence.LeaseLost if not.
            The web app and islands pass none.
        chunk_bytes: the size of the chunks tensor messages are stored in.
        data: the data plane, where tensor messages lie (DATAPLANE_REDIS_URL); default
            `client`, the one Redis.
        served: where syncd serves the run's full messages from its files
            (syncd.published_server); syncd's store publishes them there instead of on
            the data plane. None: on the data plane. Readers need none: the reference
            says where a message lies.
    """

    def __init__(self, client: redis.Redis, run_id: int | str, fence: Lease | None = None,
                 chunk_bytes: int | None = None, data: redis.Redis | None = None,
                 served: Served | None = None, writer: redis.Redis | None = None,
                 data_writer: redis.Redis | None = None):
        self.client = client
        self.served = served
        self.data = data if data is not None else client
        self.writer = writer if writer is not None else client
        self.data_writer = data_writer if data_writer is not None else self.data
        self.bulk = RedisBulk(self.data, chunk_bytes)
        self.run_id = str(run_id)
        self.prefix = run_prefix(run_id)
        if fence is not None and fence.run_id != self.run_id:
            raise ValueError(f"the lease is for run {fence.run_id}, not run {self.run_id}")
        self.fence = fence

    def key(self, *parts: object) -> str:
        return self.prefix + ":".join(str(p) for p in parts)

    @property
    def fencing_token(self) -> int:
        """The fencing token of this store's lease, 0 without one: what names the
        messages and files this syncd writes, so that no other grant's are touched."""
        return self.fence.token if self.fence is not None else 0

    def _write(self, fill: Callable[[Pipeline], object]) -> list:
        """One MULTI/EXEC of the commands `fill` queues, fenced by the lease if any."""
        if self.fence is not None:
            return guarded_transaction(self.client, self.fence, fill)
        pipe = self.client.pipeline(transaction=True)
        fill(pipe)
        return pipe.execute()

    def wrong_type(self, client: redis.Redis, key: str, exc: redis.ResponseError) -> None:
        """A key islands write held another type than syncd reads there (WRONGTYPE):
        delete it, so that it is made anew as it should be; any other error is raised
        again."""
        if "WRONGTYPE" not in str(exc):
            raise exc
        log.warning("run %s: %s held a value of the wrong type (written by an island): "
                    "deleted", self.run_id, key)
        client.delete(key)

    def own_write(self, client: redis.Redis, key: str, write: Callable[[], T]) -> T:
        """An island's write to a key of its run that islands write (`client`: its
        writing user): where another island left a value of another type there
        (WRONGTYPE), the key is deleted (wrong_type) and the write made again, so that
        no value written with the run's credential kills the island; after
        OWN_WRITE_TRIES the error is raised."""
        for _ in range(OWN_WRITE_TRIES - 1):
            try:
                return write()
            except redis.ResponseError as exc:
                self.wrong_type(client, key, exc)
        return write()
