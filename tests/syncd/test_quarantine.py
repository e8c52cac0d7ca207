"""A run's quarantined stream entries (syncd/quarantine.py), with a stream and a recorder
that only write down what they are asked. (The entries of a real stream, quarantined
by a real syncd: tests/syncd/test_hostile_entries.py.)"""

from dataclasses import dataclass, field

from syncd.quarantine import AGGREGATE_S, MAX_CAUSES, Quarantine


@dataclass
class Stream:
    run_id: str = "7"
    forgotten: list[list[bytes]] = field(default_factory=list)

    def forget_entries(self, stream_ids):
        self.forgotten.append(list(stream_ids))


@dataclass
class Recorder:
    events: list[tuple] = field(default_factory=list)

    def event(self, kind, island, **data):
        self.events.append((kind, island, data))


def quarantine() -> Quarantine:
    return Quarantine(Stream(), Recorder())


def test_settle_deletes_the_entries_quarantined_since_the_last_call_once():
    q = quarantine()
    q.add(b"1-0", "unparsable", "not a message", None)
    q.add(b"2-0", "unknown island", "names no island of the run", "mars-a")
    q.settle(now=0.0)
    q.settle(now=1.0)
    q.add(b"3-0", "unparsable", "not a message", None)
    q.settle(now=2.0)

    assert q.store.forgotten == [[b"1-0", b"2-0"], [b"3-0"]]
    assert q.total == 3


def test_repeated_entries_of_one_cause_make_one_event_every_aggregate_s_with_their_count():
    q = quarantine()
    for i in range(50):
        q.add(f"{i}-0".encode(), "forged seq", f"seq {i} is from the future", "us-east-a")
    q.settle(now=100.0)
    for i in range(50, 60):
        q.add(f"{i}-0".encode(), "forged seq", f"seq {i} is from the future", "us-east-a")
    q.settle(now=100.0 + AGGREGATE_S / 2)
    assert q.recorder.events == [("rejection", "us-east-a", {
        "reason": "seq 0 is from the future", "cause": "forged seq", "quarantined": 50})]

    q.settle(now=100.0 + AGGREGATE_S)
    q.settle(now=100.0 + 3 * AGGREGATE_S)  # nothing new: no event

    assert [e[2]["quarantined"] for e in q.recorder.events] == [50, 10]
    assert q.total == 60


def test_each_cause_has_its_own_event_and_island():
    q = quarantine()
    q.add(b"1-0", "unparsable", "not a message", None)
    q.add(b"2-0", "unverified", "signature does not match", "us-west-b")
    q.settle(now=0.0)

    assert {data["cause"]: island for _, island, data in q.recorder.events} == {
        "unparsable": None, "unverified": "us-west-b"}


def test_causes_past_the_limit_are_counted_as_other():
    q = quarantine()
    for i in range(MAX_CAUSES + 5):
        q.add(f"{i}-0".encode(), f"cause {i}", f"reason {i}", None)
    q.settle(now=0.0)

    assert len(q.causes) == MAX_CAUSES + 1
    other = [data for _, _, data in q.recorder.events if data["cause"] == "other"]
    assert other == [{"reason": f"reason {MAX_CAUSES}", "cause": "other", "quarantined": 5}]
