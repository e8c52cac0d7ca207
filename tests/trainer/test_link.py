"""The island's helper threads: heartbeats while its main thread is busy starting up,
and its link to Redis."""

import subprocess
import threading
import time
from functools import partial

import pytest

from syncd.connection import connect
from syncd.store import RunStore
from trainer.launch import free_port
from trainer.link import Link, RedisFull, beating
from webapp.processes import port_accepts, redis_argv, redis_server_binary, wait_for


def test_beating_calls_beat_while_the_body_runs_and_stops_after():
    beats = []

    with beating(lambda: beats.append(time.monotonic()), every_s=0.01):
        deadline = time.monotonic() + 5
        while len(beats) < 3 and time.monotonic() < deadline:
            time.sleep(0.005)  # a busy main thread, as when the corpus loads
    after = len(beats)
    time.sleep(0.05)

    assert after >= 3
    assert len(beats) == after  # no beat once the body is over


@pytest.mark.integration
def test_an_update_that_a_full_redis_refuses_stops_the_island_with_a_clear_error(tmp_path):
    port = free_port()
    process = subprocess.Popen(redis_argv(redis_server_binary(), port, tmp_path,
                                          appendonly=False, maxmemory_mb=2),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        client = connect(f"redis://127.0.0.1:{port}/0")
        wait_for(lambda: port_accepts(port), 10, "the small Redis")
        link = Link(partial(RunStore(client, 1).updates.push_update, "a", 1), lambda nbytes: 0.0,
                    lambda: None, max_pending=2)
        link.send(0, 1, bytearray(4 << 20))  # twice the Redis's memory
        wait_for(lambda: link.error is not None, 10, "the link to fail")

        with pytest.raises(RedisFull, match=r"maxmemory.*REDIS_MAXMEMORY_MB"):
            link.send(0, 2, bytearray(10))
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_a_send_waiting_for_room_raises_once_the_link_thread_fails():
    failing = threading.Event()

    def deliver(fragment, seq, blob):
        failing.wait(10)
        raise ConnectionError("the data plane went away")

    link = Link(deliver, lambda nbytes: 0.0, lambda: None, max_pending=1)
    link.send(0, 1, bytearray(8))  # on the wire
    deadline = time.monotonic() + 5
    while link.queue.qsize() and time.monotonic() < deadline:
        time.sleep(0.01)
    link.send(0, 2, bytearray(8))  # fills the queue
    raised = []

    def island() -> None:
        try:
            link.send(0, 3, bytearray(8))
        except RuntimeError as exc:
            raised.append(exc)

    thread = threading.Thread(target=island, daemon=True)
    thread.start()
    failing.set()
    thread.join(5)

    assert not thread.is_alive()
    assert isinstance(raised[0].__cause__, ConnectionError)


def test_discard_drops_the_messages_still_waiting_but_not_the_one_on_the_wire():
    partition_healed = threading.Event()  # never set: the first message stays on the wire
    link = Link(lambda fragment, seq, blob: None, lambda nbytes: 0.0,
                lambda: partition_healed.wait(10), max_pending=4)
    for seq in (1, 2, 3):
        link.send(0, seq, bytearray(8))
    deadline = time.monotonic() + 5
    while link.queue.qsize() != 2 and time.monotonic() < deadline:
        time.sleep(0.01)  # the link thread takes the first one onto the wire

    link.discard()

    assert link.queue.qsize() == 0
    assert link.queue.unfinished_tasks == 1


def test_a_partition_holds_at_most_max_pending_sends_and_one_on_the_wire():
    healed = threading.Event()
    delivered = []
    link = Link(lambda fragment, seq, blob: delivered.append(seq), lambda nbytes: 0.0,
                lambda: healed.wait(10), max_pending=2)
    sent = []

    def island() -> None:  # the training thread: it sends 5 updates during the partition
        for seq in range(1, 6):
            link.send(0, seq, bytearray(8))
            sent.append(seq)

    thread = threading.Thread(target=island, daemon=True)
    thread.start()
    time.sleep(0.3)

    # One message waits on the wire, two in the queue; the fourth send waits.
    assert sent == [1, 2, 3] and link.queue.qsize() == 2 and delivered == []
    healed.set()
    thread.join(5)
    link.drain(5)
    assert sent == delivered == [1, 2, 3, 4, 5]


def test_the_link_counts_its_sends_and_their_seconds_from_hold_to_delivery_not_a_partition():
    healed = threading.Event()
    link = Link(lambda fragment, seq, blob: time.sleep(0.05), lambda nbytes: nbytes / 100,
                lambda: healed.wait(10), max_pending=2)
    link.send(0, 1, bytearray(10))  # held 0.1 s, delivered in 0.05 s
    time.sleep(0.3)  # the partition's wait is not the link's time
    healed.set()
    link.drain(5)

    assert link.sends == 1
    assert 0.15 <= link.busy_s < 0.3
