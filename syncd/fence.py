"""Fenced writes: a write for a run commits only while this syncd's lease on it holds.

A lease (syncd/lease.py) says which syncd serves a run; a grant carries a fencing
token that grows with every grant. `guarded_transaction` WATCHes the run's lease key
and compares it with the grant before MULTI/EXEC, so the writes of a syncd whose
lease was taken over, or merely expired, are refused with LeaseLost and never
applied beside the new holder's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import redis
from redis.client import Pipeline


class LeaseLost(RuntimeError):
    """A write for a run was refused: this syncd no longer holds the run's lease."""


@dataclass(frozen=True)
class Lease:
    """One grant of a run's lease.

    Attributes:
        run_id: the run.
        owner: the syncd holding it (see new_owner).
        token: the fencing token: larger for every later grant of this run's lease.
        key: the run's lease key, which holds `value` while this grant is current.
    """

    run_id: str
    owner: str
    token: int
    key: str  # the run's lease key (syncd.keys.lease_key)

    @property
    def value(self) -> str:
        """What the lease key holds while this grant is current."""
        return f"{self.token}:{self.owner}"


WRITE_TRIES = 5  # a guarded write whose lease key was touched by a renewal runs again


def guarded_transaction(client: redis.Redis, lease: Lease,
                        fill: Callable[[Pipeline], object]) -> list:
    """Run the commands `fill` queues in one MULTI/EXEC, only while `lease` is current.

    The lease key is WATCHed and compared first, so the transaction is refused if the
    lease expired or changed hands before it, or changes between the check and EXEC.
    A change that leaves the lease this holder's (its own renewal, from syncd's
    lease-keeper thread) runs the transaction again.

    Raises:
        LeaseLost: the lease is no longer this holder's; nothing was written.
    """
    for _ in range(WRITE_TRIES):
        with client.pipeline(transaction=True) as pipe:
            try:
                pipe.watch(lease.key)
                current = pipe.get(lease.key)
                if current is None or current.decode() != lease.value:
                    raise LeaseLost(f"run {lease.run_id}: the lease with fencing token "
                                    f"{lease.token} is gone (now held: "
                                    f"{current.decode() if current else 'by nobody'})")
                pipe.multi()
                fill(pipe)
                return pipe.execute()
            except redis.WatchError:
                continue  # the lease key was touched: compare it again
    raise LeaseLost(f"run {lease.run_id}: the lease with fencing token {lease.token} kept "
                    f"changing during a write ({WRITE_TRIES} tries)")
