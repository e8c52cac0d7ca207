"""The Redis users of a run's islands: credentials that reach only that run's keys.

Every island process of run R connects as two Redis users that share one password,
derived from the run's secret (diloco.signing.redis_password) and kept in no key:
`arch-island-R`, which only reads (READ_COMMANDS: GET, EXISTS, HGET, HGETALL) the keys
islands read, and `arch-island-R-writes`, which writes (WRITE_COMMANDS) only the keys
islands write: its updates, its place in the queue of upload slots, heartbeats,
cursors and faults (syncd.keys.KEY_USES, whence ISLAND_READS and ISLAND_WRITES). So
the keys syncd and the web app write for islands to read (spec, epochs, versions,
published globals, handled seqs, the lease, done, stop, restart) are read-only to
islands on every Redis, 6.2 included, which has no read-only key patterns (`%R~` is
Redis 7's): each user's commands apply to its keys only. Neither user reaches a key
shared between runs (arch:runs, the pools', syncd's), the run's secret or another
run's keys, nor any keyspace-wide or @dangerous command.

The same users, with the same password and key patterns, are made on the data plane
(DATAPLANE_REDIS_URL, where the update messages and, with SYNCD_SERVE off, the
published fragments lie), where they reach only their run's messages, and read only
the published ones.

The run services make the users on both when they start the run and whenever they
launch an island epoch (`put_island_users`, idempotent), and hand launchers the
password; a launcher builds the island's URLs from its own (`island_url`, naming the
reading user), so the island process holds that credential and not the one of the
control plane, and `island_store` connects as both users. syncd makes the users of
the runs it serves again after a restart of either Redis (which forgets users that
were made at run time) and deletes those of runs whose keys are gone
(`sweep_island_users`).

A Redis without ACL (before 6.0), or a credential that may not manage users, makes no
user: `put_island_user` says why, and islands get the launcher's URLs, as before (on
both planes: one password serves both, or none does).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable
from urllib.parse import quote, unquote, urlsplit, urlunsplit

import redis

from diloco.signing import redis_password
from syncd.connection import connect
from syncd.keys import ISLAND_READS, ISLAND_WRITES, island_key_patterns, spec_key
from syncd.store import RunStore

log = logging.getLogger("archipelago.acl")
USER_PREFIX = "arch-island-"
WRITER_SUFFIX = "-writes"
# What an island process sends of its reads: syncd.store's reads of the keys islands
# read, and a connection's PING.
READ_COMMANDS = ("ping", "get", "exists", "hget", "hgetall")
# ... and of its writes: an update's chunks and stream entry (SET, XADD), its place in
# the queue for upload slots (RPUSH, LPOS: it cannot take a ticket off,
# syncd/upload_slots.py), heartbeats, cursors, and the deletions of what it wrote
# as its run ended (syncd.update_stream.clear_after_end) or of a fault it acted out.
WRITE_COMMANDS = ("ping", "set", "del", "hset", "xadd", "rpush", "lpos")


def island_user(run_id: int | str) -> str:
    """The name of the reading Redis user of run `run_id`'s islands (the one an island's
    URL names)."""
    return f"{USER_PREFIX}{run_id}"


def island_writer(run_id: int | str) -> str:
    """The name of the writing Redis user of run `run_id`'s islands."""
    return f"{USER_PREFIX}{run_id}{WRITER_SUFFIX}"


def island_rules(run_id: int | str, password: str, db: int = 0, writes: bool = False
                 ) -> list[str]:
    """The ACL SETUSER rules of run `run_id`'s island user that reads (or, with `writes`,
    the one that writes): everything reset, then its password, its keys and its
    commands (and SELECT of `db` alone, if it is not 0)."""
    parts, commands = (ISLAND_WRITES, WRITE_COMMANDS) if writes else (ISLAND_READS,
                                                                      READ_COMMANDS)
    rules = ["reset", "on", f">{password}",
             *(f"~{pattern}" for pattern in island_key_patterns(run_id, parts)),
             *(f"+{command}" for command in commands)]
    return [*rules, f"+select|{db}"] if db else rules


def put_island_user(client: redis.Redis, run_id: int | str, secret: bytes
                    ) -> tuple[str | None, str | None]:
    """Make (or make again) the island users of run `run_id`: (their password, None), or
    (None, why not) where this Redis has no ACL or this client may not manage users."""
    password = redis_password(secret)
    db = int(client.connection_pool.connection_kwargs.get("db", 0))
    try:
        for name, writes in ((island_user(run_id), False), (island_writer(run_id), True)):
            client.execute_command("ACL", "SETUSER", name,
                                   *island_rules(run_id, password, db, writes))
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
    """Delete the island users of run `run_id` (nothing if there are none, or no ACL);
    connections made as those users are closed by Redis."""
    with contextlib.suppress(redis.ResponseError):  # no ACL on this Redis: no user
        client.execute_command("ACL", "DELUSER", island_user(run_id), island_writer(run_id))


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


def writer_url(url: str) -> str:
    """The URL of the island user that writes, from `url`, the island's URL (which names
    the one that reads, with their one password); `url` itself if it names no island
    user (a Redis without ACL: the launcher's URL)."""
    parts = urlsplit(url)
    user = unquote(parts.username or "")
    if not user.startswith(USER_PREFIX) or user.endswith(WRITER_SUFFIX):
        return url
    netloc = parts.netloc.replace(quote(user, safe="") + ":",
                                  quote(user + WRITER_SUFFIX, safe="") + ":", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def island_store(url: str, dataplane_url: str, run_id: int | str) -> RunStore:
    """The store an island process holds for its run: reading as the island user its
    URLs name, writing as the run's island user that writes (on each plane)."""
    def both(of: str) -> tuple[redis.Redis, redis.Redis]:
        reads = connect(of, ride_out_restarts=True)
        return reads, (connect(writer_url(of), ride_out_restarts=True)
                       if writer_url(of) != of else reads)

    client, writer = both(url)
    data, data_writer = both(dataplane_url) if dataplane_url != url else (client, writer)
    return RunStore(client, run_id, data=data, writer=writer, data_writer=data_writer)


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
        if island_user(run_id) not in users or island_writer(run_id) not in users:
            _, why = put_island_user(client, run_id, secret)
            if why is None:
                log.warning("run %s: made its island user again (Redis had lost it)", run_id)
    for user in users:
        if not user.startswith(USER_PREFIX):
            continue
        run_id = user[len(USER_PREFIX):].removesuffix(WRITER_SUFFIX)
        if not control.exists(spec_key(run_id)):
            delete_island_user(client, run_id)
