"""The islands' signals (syncd.island_signals): heartbeats, deaths, logs, commands,
data cursors and faults, against a real Redis."""

import dataclasses
import json
import time

import pytest

from syncd.connection import connect
from syncd.island_signals import LOG_TTL_S, IslandSignals
from syncd.records import Heartbeat

pytestmark = pytest.mark.integration


@pytest.fixture
def store(redis_url):
    return IslandSignals(connect(redis_url), 7)


def test_a_fault_set_by_syncd_is_what_the_island_reads(store):
    store.set_fault("a", "straggle", time.time() + 30, 4.0, 30)
    assert store.fault("a")["factor"] == 4.0
    assert store.faults(["a", "b"]) == {"a": "straggle"}
    assert 90 - 2 <= store.client.ttl(store.key("fault", "a")) <= 90


def test_an_ended_or_cleared_fault_is_no_fault(store):
    store.set_fault("a", "partition", time.time() - 1, 1.0, 30)
    store.set_fault("b", "degrade", time.time() + 30, 2.0, 30)
    store.clear_fault("b")

    assert store.fault("a") == {} and store.fault("b") == {}
    assert store.faults(["a", "b"]) == {} and store.faults([]) == {}


def test_a_heartbeat_reads_back_as_the_record_the_island_wrote(store):
    sent = Heartbeat.bare(2, time.time(), 40, 1280, loss=2.5, phases={"pull": 0.5})
    store.heartbeat("a", sent)

    assert store.heartbeats() == {"a": sent}


def test_a_death_by_a_signal_records_the_signal_and_comes_with_the_epochs(store):
    store.client.hset(store.key("epochs"), "a", 3)
    store.report_death("a", 3, -9, at=100.0)
    store.report_death("b", 1, 1, at=101.0)

    epochs, deaths = store.epochs_and_deaths()

    assert epochs == {"a": 3}
    assert deaths == store.deaths() == {
        "a": {"epoch": 3, "time": 100.0, "exit_code": -9, "signal": 9},
        "b": {"epoch": 1, "time": 101.0, "exit_code": 1, "signal": None}}


def test_commands_reach_the_island_in_the_order_they_were_sent(store):
    store.send_command("a", "rejoin", epoch=2)
    store.send_command("a", "stop")

    assert store.next_command("a") == {"kind": "rejoin", "epoch": 2}
    assert store.next_command("a") == {"kind": "stop"}
    assert store.next_command("a") is None


def test_the_log_lasts_a_week_and_the_cursor_until_replaced(store):
    assert store.log("a") is None and store.cursor("a") is None
    store.put_log("a", ["one", "two"])
    store.save_cursor("a", {"step": 4})
    store.save_cursor("a", {"step": 8})

    assert store.log("a") == ["one", "two"]
    assert LOG_TTL_S - 60 <= store.client.ttl(store.key("log", "a")) <= LOG_TTL_S
    assert store.cursor("a") == {"step": 8}


def beat_json(**fields: object) -> bytes:
    return json.dumps({**dataclasses.asdict(Heartbeat.bare(1, 1.0, 1, 1)), **fields}).encode()


@pytest.mark.parametrize("value", [b"junk", b"[1, 2]", beat_json(epoch="x"),
                                   beat_json(time="now"), beat_json(time=None),
                                   b'{"epoch": 1, "step": 1, "tokens": 1}',
                                   beat_json(step=2**60), beat_json(state="dancing"),
                                   beat_json(x="y" * 70_000), beat_json(x=1)])
def test_a_heartbeat_that_is_not_one_is_left_out_and_the_others_read(store, value, caplog):
    """Islands write the heartbeats hash: whatever one writes there, syncd reads the
    other islands' heartbeats and none from it, and says why once."""
    store.heartbeat("a", Heartbeat.bare(1, time.time(), 3, 12))
    store.client.hset(store.key("heartbeats"), "b", value)

    assert list(store.heartbeats()) == list(store.heartbeats()) == ["a"]
    refused = [r.getMessage() for r in caplog.records if "heartbeat is not one" in r.getMessage()]
    assert len(refused) == 1 and "island b" in refused[0]


@pytest.mark.parametrize("value", [b"junk", b"[]", b'{"until": 1e400}', b'{"kind": "x", '
                                   b'"until": "soon"}'])
def test_a_fault_that_is_not_one_is_no_fault(store, value):
    store.set_fault("a", "straggle", time.time() + 30, 4.0, 30)
    store.client.set(store.key("fault", "b"), value)

    assert store.faults(["a", "b"]) == {"a": "straggle"}


@pytest.mark.parametrize("value", [b"junk", b"[1]", b"1e400", b"[" * 50_000,
                                   b"{" * 100_000])
def test_a_cursor_or_fault_that_is_not_one_is_none(store, value):
    """Islands write their cursors and may clear their faults: the web app and the
    supervisor read none from junk, and the island acts out no fault."""
    store.client.set(store.key("cursor", "a"), value)
    store.client.set(store.key("fault", "a"), value)

    assert store.cursor("a") is None and store.fault("a") == {}


def test_a_cursor_of_another_type_is_none_and_made_anew(store):
    store.client.hset(store.key("cursor", "a"), "step", 3)

    assert store.cursor("a") is None
    store.save_cursor("a", {"step": 4})
    assert store.cursor("a") == {"step": 4}
