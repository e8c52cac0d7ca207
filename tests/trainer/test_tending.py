"""The tend thread's work (trainer/tending.py), against fakes of what it reads and writes."""

import logging
from types import SimpleNamespace

import redis
import torch

from trainer.tending import Tending

ISLAND = SimpleNamespace(step=8, tokens=256,
                         sampler=SimpleNamespace(state=lambda: torch.zeros(2, dtype=torch.uint8)))
CURSOR = {"step": 8, "tokens": 256, "rng": "AAA="}


class FakeStore:
    """The parts of a RunStore the tend thread uses; `failing` makes every call raise."""

    def __init__(self):
        self.failing = False
        self.cursors: list[dict] = []
        self.done_reads = 0
        self.tau = None  # syncd's choice, as the control key holds it
        self.control = SimpleNamespace(done=self._done, tau=lambda: self.tau)
        self.signals = SimpleNamespace(save_cursor=self._save_cursor)

    def _done(self) -> bool:
        if self.failing:
            raise redis.ConnectionError("link cut")
        self.done_reads += 1
        return self.done_reads > 1

    def _save_cursor(self, island: str, cursor: dict) -> None:
        self.cursors.append(cursor)


def tending(store: FakeStore, beats: list) -> Tending:
    reads = SimpleNamespace(read=lambda: None)
    return Tending(store, "a", reads, reads, lambda: beats.append(1))


def test_a_tend_reads_the_runs_end_writes_the_kept_cursor_once_and_beats():
    store, beats = FakeStore(), []
    t = tending(store, beats)
    t.keep_cursor(ISLAND)
    t.tend()
    t.tend()
    assert store.cursors == [CURSOR] and len(beats) == 2
    assert t.done()  # the second read said done; no read of its own
    assert store.done_reads == 2


def test_redis_out_of_reach_is_logged_once_and_the_kept_cursor_is_written_later(caplog):
    store, beats = FakeStore(), []
    t = tending(store, beats)
    t.keep_cursor(ISLAND)
    store.failing = True
    with caplog.at_level(logging.WARNING, logger="archipelago.island"):
        t.tend()
        t.tend()
    assert len([r for r in caplog.records if "out of reach" in r.message]) == 1
    store.failing = False
    t.tend()
    assert store.cursors == [CURSOR] and beats == [1]


def test_a_tend_reads_the_tau_syncd_chose_and_the_island_uses_the_configs_until_then():
    store = FakeStore()
    t = tending(store, [])
    t.tend()
    assert t.tau(1) == 1
    store.tau = 0
    t.tend()
    assert t.tau(1) == 0


def test_the_loop_reads_the_runs_end_itself_when_the_tend_thread_has_not_for_a_while():
    store = FakeStore()
    t = tending(store, [])
    assert not t.done()  # never tended: read here
    assert store.done_reads == 1
