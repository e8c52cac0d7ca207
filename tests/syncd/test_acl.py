"""The island users of a run (syncd/acl.py), on a real Redis: they read what its islands
read and write what they write, and nothing else: not a key they only read, not a key
shared between runs, not another run's keys, not its run's secret, not the pools', and
no keyspace-wide command."""

from __future__ import annotations

import secrets
import time

import pytest
import redis

from diloco.signing import redis_password
from syncd.acl import (
    delete_island_user,
    island_rules,
    island_store,
    island_url,
    island_user,
    island_writer,
    put_island_user,
    put_island_users,
    sweep_island_users,
    writer_url,
)
from syncd.connection import connect
from syncd.keys import ISLAND_READS, ISLAND_WRITES, RUNS_KEY, island_key_patterns, pool_key
from syncd.records import Heartbeat
from syncd.store import RunStore

pytestmark = pytest.mark.integration

SECRET = secrets.token_bytes(32)
OTHER_SECRET = secrets.token_bytes(32)


@pytest.fixture
def two_runs(client):
    """Runs 7 and 8 started as the run services start them, and run 7's island user."""
    for run_id, secret in ((7, SECRET), (8, OTHER_SECRET)):
        RunStore(client, run_id).put_spec("decoupled", {"islands": []}, secret.hex())
        RunStore(client, run_id).set_epoch("a", 1)
    password, why = put_island_user(client, 7, SECRET)
    assert why is None
    yield password
    for run_id in (7, 8):
        delete_island_user(client, run_id)


def as_island(redis_url: str, password: str, writes: bool = False) -> redis.Redis:
    url = island_url(redis_url, 7, password)
    return connect(writer_url(url) if writes else url)


def test_an_island_user_reads_and_writes_its_runs_keys_as_an_island_does(
        redis_url, client, two_runs):
    url = island_url(redis_url, 7, two_runs)
    island = island_store(url, url, 7)
    assert island.writer is not island.client
    assert island.spec()["mode"] == "decoupled"
    assert island.is_active() and island.epochs() == {"a": 1}
    island.updates.wait_for_slot("a", 1, 0, 3, slots=2)
    island.updates.push_update("a", 1, 0, 3, b"x" * 100)
    island.signals.heartbeat("a", Heartbeat.bare(1, time.time(), 3, 12))
    island.signals.save_cursor("a", {"step": 3})
    assert island.signals.cursor("a") == {"step": 3}
    assert island.globals.handled_seq(0, "a") == -1 and island.globals.versions() == {}
    assert not island.control.done() and island.control.stop_requested() is None
    island.signals.clear_fault("a")
    assert RunStore(client, 7).signals.heartbeats()["a"].step == 3
    assert client.xlen(RunStore(client, 7).key("updates")) == 1
    island.updates.clear_after_end("a", 1, 0, 3, 100)  # what it wrote as its run ended
    assert not client.exists(island.key("updates"), island.key("uploads"),
                             island.updates.update_key("a", 1, 0, 3) + ":0")


SHARED_AND_READ_ONLY = [
    ("DEL", RUNS_KEY), ("SET", RUNS_KEY, "x"), ("SADD", RUNS_KEY, "9"),
    ("SISMEMBER", RUNS_KEY, "7"), ("SET", "arch:7:spec", "{}"), ("DEL", "arch:7:spec"),
    ("HSET", "arch:7:epochs", "x", "junk"), ("HSET", "arch:7:versions", "0", "9"),
    ("SET", "arch:7:full:0", "{}"), ("DEL", "arch:7:full:0:1:1:0"),
    ("HSET", "arch:7:handled:0", "a", "99"), ("SET", "arch:7:lease", "1:x"),
    ("DEL", "arch:7:lease"), ("SET", "arch:7:done", "1"), ("DEL", "arch:7:stop"),
    ("HSET", "arch:7:restart", "generation", "9"), ("DEL", "arch:7:active"),
    ("SET", "arch:7:pub:0:1", "{}"),
]


@pytest.mark.parametrize("writes", [False, True], ids=["reads", "writes"])
@pytest.mark.parametrize("command", SHARED_AND_READ_ONLY)
def test_neither_island_user_writes_a_shared_key_or_one_islands_only_read(
        redis_url, client, two_runs, command, writes):
    client.set("arch:7:full:0", "kept")
    with pytest.raises(redis.exceptions.NoPermissionError):
        as_island(redis_url, two_runs, writes).execute_command(*command)
    assert client.smembers(RUNS_KEY) == {b"7", b"8"} and client.get("arch:7:full:0") == b"kept"


def test_the_island_user_that_reads_sends_no_write_command_at_all(redis_url, two_runs):
    reader = as_island(redis_url, two_runs)
    for command in [("SET", "arch:7:cursor:a", "{}"), ("XADD", "arch:7:updates", "*", "a", "1"),
                    ("HSET", "arch:7:heartbeats", "a", "{}"), ("DEL", "arch:7:uploads")]:
        with pytest.raises(redis.exceptions.NoPermissionError):
            reader.execute_command(*command)


@pytest.mark.parametrize("writes", [False, True], ids=["reads", "writes"])
@pytest.mark.parametrize("command", [
    ("GET", "arch:7:secret"), ("GET", "arch:8:spec"), ("SET", "arch:8:cursor:a", "{}"),
    ("HGETALL", "arch:8:epochs"), ("LPUSH", pool_key("us-east", "claims"), "{}"),
    ("GET", "arch:7:lease_token"), ("SET", "arch:8:lease", "1:x"),
    ("RPUSH", "arch:7:control:a", "{}"), ("GET", "celery"),
    ("SREM", RUNS_KEY, "8"), ("SMEMBERS", RUNS_KEY), ("KEYS", "*"), ("SCAN", "0"),
    ("FLUSHALL",), ("FLUSHDB",), ("CONFIG", "GET", "requirepass"), ("ACL", "LIST"),
    ("SELECT", "1"), ("DEBUG", "SLEEP", "0"), ("SHUTDOWN",), ("EVAL", "return 1", "0"),
    ("LREM", "arch:7:uploads", "0", "1:0:3:a"), ("LPOP", "arch:7:uploads"),
    ("RPUSH", "arch:8:uploads", "1:0:3:a"),
])
def test_an_island_user_cannot_touch_what_is_not_its_runs(redis_url, client, two_runs,
                                                          command, writes):
    island = as_island(redis_url, two_runs, writes)
    with pytest.raises(redis.exceptions.NoPermissionError):
        island.execute_command(*command)
    assert client.get("arch:7:secret") == SECRET.hex().encode()
    assert client.exists("arch:8:spec")


def test_an_island_user_without_its_password_or_with_another_runs_cannot_connect(
        redis_url, two_runs):
    for password in ("wrong", redis_password(OTHER_SECRET)):
        with pytest.raises(redis.AuthenticationError):
            as_island(redis_url, password).ping()


def test_the_island_url_is_the_launchers_own_as_the_runs_user_or_itself_without_one():
    url = "rediss://:control-pw@redis.example:6380/2"
    assert island_url(url, 7, "ab12") == "rediss://arch-island-7:ab12@redis.example:6380/2"
    assert writer_url(island_url(url, 7, "ab12")) == \
        "rediss://arch-island-7-writes:ab12@redis.example:6380/2"
    assert island_url(url, 7, None) == url == writer_url(url)


def test_an_island_user_of_another_database_may_select_that_one_alone():
    assert "+select|2" in island_rules(7, "pw", db=2)
    assert not [r for r in island_rules(7, "pw") if r.startswith("+select")]
    assert [r[1:] for r in island_rules(7, "pw") if r.startswith("~")] == \
        island_key_patterns(7, ISLAND_READS)
    assert [r[1:] for r in island_rules(7, "pw", writes=True) if r.startswith("~")] == \
        island_key_patterns(7, ISLAND_WRITES)


def test_the_sweep_makes_a_lost_user_again_and_deletes_the_users_of_ended_runs(
        redis_url, client, two_runs):
    put_island_user(client, 8, OTHER_SECRET)
    client.execute_command("ACL", "DELUSER", island_user(7))  # as a restart of Redis would
    RunStore(client, 8).release(linger_s=60)
    client.delete(RunStore(client, 8).key("spec"))  # its linger passed
    sweep_island_users(client, client, [("7", SECRET)])
    users = {u.decode() for u in client.execute_command("ACL", "USERS")}
    assert {island_user(7), island_writer(7)} <= users
    assert not {island_user(8), island_writer(8)} & users
    assert as_island(redis_url, two_runs).ping() and as_island(redis_url, two_runs, True).ping()


@pytest.fixture
def data_users(client, dataplane_url, two_runs):
    """Run 7's island user made on both planes, as the run services make it; the data
    plane's client."""
    data = connect(dataplane_url)
    password, why = put_island_users(client, data, 7, SECRET)
    assert why is None and password == two_runs
    yield data
    for run_id in (7, 8):
        delete_island_user(data, run_id)


def test_an_island_user_on_the_data_plane_writes_its_runs_messages_and_no_others(
        redis_url, dataplane_url, client, data_users):
    other = RunStore(client, 8, data=data_users)
    other.updates.push_update("a", 1, 0, 3, b"y" * 100)
    password = redis_password(SECRET)
    island = island_store(island_url(redis_url, 7, password),
                          island_url(dataplane_url, 7, password), 7)
    island.updates.push_update("a", 1, 0, 3, b"x" * 100)
    assert data_users.get(island.updates.update_key("a", 1, 0, 3) + ":0") == b"x" * 100
    theirs = other.updates.update_key("a", 1, 0, 3) + ":0"
    data_users.set("arch:7:full:0:1:1:0", b"published")
    for command in [("GET", theirs), ("DEL", theirs), ("SET", theirs, "z"), ("KEYS", "*"),
                    ("FLUSHALL",), ("CONFIG", "GET", "maxmemory"),
                    ("SET", "arch:7:full:0:1:1:0", "forged"), ("DEL", "arch:7:full:0:1:1:0")]:
        for user in (island.data, island.data_writer):
            with pytest.raises(redis.exceptions.NoPermissionError):
                user.execute_command(*command)
    assert island.data.get("arch:7:full:0:1:1:0") == b"published"
    assert data_users.get(theirs) == b"y" * 100


def test_islands_get_no_password_where_the_data_plane_makes_no_user(
        client, dataplane_url, two_runs):
    data = connect(dataplane_url)
    data.execute_command("ACL", "SETUSER", "no-acl", "reset", "on", ">pw", "~*", "+@all",
                         "-acl")
    try:
        limited = connect(dataplane_url.replace("redis://", "redis://no-acl:pw@", 1))
        password, why = put_island_users(client, limited, 7, SECRET)
        assert password is None and why is not None
    finally:
        data.execute_command("ACL", "DELUSER", "no-acl")


def test_the_sweep_of_the_data_plane_reads_which_runs_ended_on_the_control_plane(
        dataplane_url, client, data_users):
    put_island_users(client, data_users, 8, OTHER_SECRET)
    data_users.execute_command("ACL", "DELUSER", island_user(7))  # the data plane restarted
    client.delete(RunStore(client, 8).key("spec"))  # run 8 ended and its linger passed
    sweep_island_users(client, data_users, [("7", SECRET)])
    users = {u.decode() for u in data_users.execute_command("ACL", "USERS")}
    assert island_user(7) in users and island_user(8) not in users
    assert connect(island_url(dataplane_url, 7, redis_password(SECRET))).ping()
