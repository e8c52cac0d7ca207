"""Leases on runs, so that several syncd processes can split the runs between them.

A run is served by the syncd that holds its lease: the key arch:R:lease holds
"<token>:<owner>" with a time to live, set only if the key is absent (SET NX
PX). The token comes from INCR on arch:R:lease_token, a counter that is never
reset, so every grant of a run's lease has a larger token than the last: it is
the fencing token. The holder renews the lease well before it expires; a syncd
that dies (kill -9, its host gone) stops renewing and another takes the run
over once the time to live has passed.

A holder can lose its lease without knowing (paused for longer than the time to
live, cut off from Redis). Every write syncd makes for a run therefore goes
through `syncd.fence.guarded_transaction`: the lease key is WATCHed and compared with the
holder's "<token>:<owner>" before MULTI/EXEC, so the writes of a syncd whose
lease was taken over (or merely expired) are refused with LeaseLost, never
applied beside the new holder's.

syncd processes also announce themselves in arch:syncd:members (owner ->
expiry, in Redis's clock), so that each can take its fair share of the active
runs: ceil(runs / members alive).
"""

from __future__ import annotations

import math
import os
import secrets
import socket

import redis

from syncd.fence import Lease
from syncd.keys import SYNCD_MEMBERS_KEY, lease_key, lease_token_key

# KEYS: lease, token counter. ARGV: owner, ttl ms. Returns the new token, or nil when
# someone holds the lease.
_ACQUIRE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return false end
local token = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], token .. ':' .. ARGV[1], 'NX', 'PX', ARGV[2])
return token
"""
# KEYS: lease. ARGV: holder value, ttl ms. 1 if renewed, 0 if the lease is not ours.
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""
# KEYS: lease. ARGV: holder value. 1 if released, 0 if it was not ours.
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
# KEYS: members. ARGV: owner, ttl ms. Returns the number of members alive (ours included).
_REGISTER = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
return redis.call('ZCARD', KEYS[1])
"""
# KEYS: members. Returns the owners whose announcement has not expired.
_ALIVE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')
"""


def new_owner() -> str:
    """A name for this syncd process: host, pid and a random part (pids are reused)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


def _ms(seconds: float) -> int:
    if seconds <= 0:
        raise ValueError(f"a lease's time to live must be above 0 seconds, got {seconds}")
    return max(1, round(seconds * 1000))


def acquire(client: redis.Redis, run_id: int | str, owner: str, ttl_s: float) -> Lease | None:
    """Take the run's lease if nobody holds it; None if somebody does."""
    token = client.eval(_ACQUIRE, 2, lease_key(run_id), lease_token_key(run_id), owner,
                        _ms(ttl_s))
    return None if token is None else Lease(str(run_id), owner, int(token), lease_key(run_id))


def renew(client: redis.Redis, lease: Lease, ttl_s: float) -> bool:
    """Extend the lease by ttl_s from now; False if it expired or another holds it."""
    return bool(client.eval(_RENEW, 1, lease.key, lease.value, _ms(ttl_s)))


def release(client: redis.Redis, lease: Lease) -> bool:
    """Give the lease up at once (another syncd may take the run); False if not ours."""
    return bool(client.eval(_RELEASE, 1, lease.key, lease.value))


def holder(client: redis.Redis, run_id: int | str) -> tuple[int, str] | None:
    """(token, owner) of the run's current lease, or None when nobody holds it."""
    raw = client.get(lease_key(run_id))
    if raw is None:
        return None
    token, owner = (raw.decode() if isinstance(raw, bytes) else raw).split(":", 1)
    return int(token), owner


def register(client: redis.Redis, owner: str, ttl_s: float) -> int:
    """Announce this syncd for ttl_s more seconds; returns how many syncd are alive."""
    return int(client.eval(_REGISTER, 1, SYNCD_MEMBERS_KEY, owner, _ms(ttl_s)))


def leave(client: redis.Redis, owner: str) -> None:
    """Withdraw this syncd's announcement (a clean stop)."""
    client.zrem(SYNCD_MEMBERS_KEY, owner)


def members_alive(client: redis.Redis) -> list[str]:
    """The owners of every syncd whose announcement has not expired."""
    return [m.decode() if isinstance(m, bytes) else m
            for m in client.eval(_ALIVE, 1, SYNCD_MEMBERS_KEY)]


def fair_share(runs: int, members: int) -> int:
    """How many of `runs` active runs one of `members` syncd alive should serve."""
    return math.ceil(runs / max(members, 1))
