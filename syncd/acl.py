"""The Redis user of a run's islands: a credential that reaches only that run's keys.

Every island process of run R connects as the Redis user `arch-island-R`, whose
password derives from the run's secret (diloco.signing.redis_password) and is kept
in no key. The user may run only the commands islands use (ISLAND_COMMANDS: reads
and writes of single keys, never KEYS, SCAN, FLUSHALL, CONFIG, ACL, SELECT of another
database or anything in @dangerous) on only the keys islands touch
(syncd.keys.island_key_patterns): not the run's secret, not another run's keys, not
the pools', syncd's, Celery's or the channel layer's.

The same user, with the same password and key patterns, is made on the data plane
(DATAPLANE_REDIS_URL, where the update messages and, with SYNCD_SERVE off, the
published fragments lie), where it reaches only its run's messages: an island can
neither read nor delete another run's. Its key patterns grant reads and writes alike
(read-only patterns need Redis 7; the embedded Redis is 6.2), so it may still write
its own run's published fragments' keys; what it writes there fails every island's
check of syncd's signature (diloco/protocol.py) and is refused.

The run services make the user on both when they start the run and whenever they
launch an island epoch (`put_island_users`, idempotent), and hand launchers its
password; a launcher builds the island's URLs from its own (`island_url`), so the
island process holds that credential and not the one of the control plane. syncd
makes the users of the runs it serves again after a restart of either Redis (which
forgets users that were made at run time) and deletes those of runs whose keys are
gone (`sweep_island_users`).

A Redis without ACL (before 6.0), or a credential that may not manage users, makes no
user: `put_island_user` says why, and islands get the launcher's URLs, as before (on
both planes: one password serves both, or none does).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable
from urllib.parse import quote, urlsplit, urlunsplit

import redis

from diloco.signing import redis_password
from syncd.keys import island_key_patterns, spec_key

log = logging.getLogger("archipelago.acl")
USER_PREFIX = "arch-island-"
# What an island process sends (syncd.store's reads and writes of its keys, and a
# connection's PING). SISMEMBER is how it reads arch:runs, which it could not change
# with any of these: it has no SADD or SREM. RPUSH and LPOS are its place in the
# queue for upload slots (syncd/upload_slots.py); it cannot take a ticket off.
ISLAND_COMMANDS = ("ping", "get", "set", "del", "exists", "hget", "hset", "hgetall",
                   "sismember", "xadd", "rpush", "lpos")


def island_user(run_id: int | str) -> str:
    """The name of the Redis user of run `run_id`'s islands."""
    return f"{USER_PREFIX}{run_id}"


def island_rules(run_id: int | str, password: str, db: int = 0) -> list[str]:
    """The ACL SETUSER rules of run `run_id`'s island user: everything reset, then its
    password, its keys and its commands (and SELECT of `db` alone, if it is not 0)."""
    rules = ["reset", "on", f">{password}",
             *(f"~{pattern}" for pattern in island_key_patterns(run_id)),
             *(f"+{command}" for command in ISLAND_COMMANDS)]
    return [*rules, f"+select|{db}"] if db else rules


def put_island_user(client: redis.Redis, run_id: int | str, secret: bytes
                    ) -> tuple[str | None, str | None]:
    """Make (or make again) the island user of run `run_id`: (its password, None), or
    (None, why not) where this Redis has no ACL or this client may not manage users."""
    password = redis_password(secret)
    db = int(client.connection_pool.connection_kwargs.get("db", 0))
    try:
        client.execute_command("ACL", "SETUSER", island_user(run_id),
                               *island_rules(run_id, password, db))
    except redis.ResponseError as e:
        return None, f"Redis made no island user ({e}): islands connect as the control plane"
    return password, None


def put_island_users(control: redis.Redis, data: redis.Redis, run_id: int | str,
                     secret: bytes) -> tuple[str | None, str | None]:
    """Make (or make again) the island user of run `run_id` on the control plane and on
    the data plane (once where they are one Redis): (its password, None), or (None, why
    not) where either made none: then islands connect with the launcher's URLs."""
    password, why = None, None
    for client in _planes(control, data):
        password, why = put_island_user(client, run_id, secret)
        if password is None:
            break
    return password, why


def delete_island_users(control: redis.Redis, data: redis.Redis, run_id: int | str) -> None:
    """Delete the island user of run `run_id` from the control plane and the data plane."""
    for client in _planes(control, data):
        delete_island_user(client, run_id)


def delete_island_user(client: redis.Redis, run_id: int | str) -> None:
    """Delete the island user of run `run_id` (nothing if there is none, or no ACL);
    connections made as that user are closed by Redis."""
    with contextlib.suppress(redis.ResponseError):  # no ACL on this Redis: no user
        client.execute_command("ACL", "DELUSER", island_user(run_id))


def _planes(control: redis.Redis, data: redis.Redis) -> tuple[redis.Redis, ...]:
    """The Redis servers a run's island user lives on: both planes, or the one Redis
    that is both."""
    return (control,) if data is control else (control, data)


def island_url(url: str, run_id: int | str, password: str | None) -> str:
    """The URL an island of run `run_id` connects with: `url` (the launcher's own) as the
    run's island user, or `url` itself when there is no such user (`password` None)."""
    if password is None:
        return url
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = (f"{quote(island_user(run_id), safe='')}:{quote(password, safe='')}@{host}"
              + (f":{parts.port}" if parts.port else ""))
    return urlunsplit(parts._replace(netloc=netloc))


def sweep_island_users(control: redis.Redis, data: redis.Redis,
                       served: Iterable[tuple[str, bytes]]) -> None:
    """On each plane, make the island users of the `served` runs ((run id, secret)
    pairs) that its Redis does not know (it restarted), and delete those of runs whose
    spec is gone from the control plane (ended, their keys gone, or deleted). Nothing
    on a Redis without ACL."""
    served = list(served)
    for client in _planes(control, data):
        _sweep(client, served, control)


def _sweep(client: redis.Redis, served: list[tuple[str, bytes]], control: redis.Redis) -> None:
    try:
        users = {u.decode() if isinstance(u, bytes) else u
                 for u in client.execute_command("ACL", "USERS")}
    except redis.ResponseError:
        return
    for run_id, secret in served:
        if island_user(run_id) not in users:
            _, why = put_island_user(client, run_id, secret)
            if why is None:
                log.warning("run %s: made its island user again (Redis had lost it)", run_id)
    for user in users:
        if not user.startswith(USER_PREFIX):
            continue
        run_id = user[len(USER_PREFIX):]
        if not control.exists(spec_key(run_id)):
            delete_island_user(client, run_id)
