"""Elastic's whole-job restarts as an island follows them (trainer.elastic): a store
that announces restarts in memory, and a clock of the tests' own."""

from types import SimpleNamespace

import pytest

from diloco.data import load_corpus
from diloco.fragments import partition
from diloco.island import Island, initial_model
from syncd.environment import data_dir
from trainer import elastic
from trainer.elastic import WholeJobRestarts


class Restarts:
    """syncd's announcements of restarts (the RestartStore protocol), as
    RunControl.restart_job makes them."""

    def __init__(self, generation: int = 0):
        self.generation, self.until = generation, 0.0

    def restart_job(self, until: float) -> None:
        self.generation += 1
        self.until = until

    def restart(self) -> tuple[int, float]:
        return self.generation, self.until


@pytest.fixture
def clock(monkeypatch):
    """The restarts' time: now, advanced by each sleep they take."""
    state = SimpleNamespace(now=1000.0, sleeps=0)

    def sleep(seconds: float) -> None:
        state.now += seconds
        state.sleeps += 1

    monkeypatch.setattr(elastic, "time", SimpleNamespace(time=lambda: state.now, sleep=sleep))
    return state


@pytest.fixture
def island(make_config) -> Island:
    config = make_config(sync={"fragments": 2})
    init = initial_model(config).state_dict()
    fragments = partition({n: t.numel() for n, t in init.items()}, 2)
    return Island(0, config, load_corpus(config.data.path, config.data.eval_fraction, data_dir()),
                  fragments, init)


def test_restarts_before_the_island_started_are_not_its_to_follow():
    store = Restarts(generation=3)
    restarts = WholeJobRestarts(store, inner_steps=4)

    assert not restarts.pending() and restarts.take() is None


def test_a_restart_announced_is_pending_until_taken_once_with_its_end():
    store = Restarts()
    restarts = WholeJobRestarts(store, inner_steps=4)

    store.restart_job(until=1010.0)
    assert restarts.pending() and restarts.until() == 1010.0

    assert restarts.take() == 1010.0
    assert not restarts.pending() and restarts.take() is None


def test_two_restarts_announced_before_a_take_are_followed_as_the_last_one():
    store = Restarts()
    restarts = WholeJobRestarts(store, inner_steps=4)
    store.restart_job(until=1010.0)
    store.restart_job(until=1020.0)

    assert restarts.take() == 1020.0 and restarts.take() is None


def test_joining_starts_a_fresh_outer_step_at_the_next_multiple_of_h(island, clock):
    restarts = WholeJobRestarts(Restarts(), inner_steps=4)
    island.move_to(5, 320)

    restarts.join(island, until=0.0, beat=lambda: None, stopping=lambda: False)

    assert (island.step, island.tokens) == (8, 320)
    restarts.join(island, until=0.0, beat=lambda: None, stopping=lambda: False)
    assert island.step == 8  # already at an outer step's start


def test_joining_waits_for_the_restarts_end_and_beats_meanwhile(island, clock):
    restarts = WholeJobRestarts(Restarts(), inner_steps=4)
    beats = []

    restarts.join(island, until=clock.now + 1.0, beat=lambda: beats.append(clock.now),
                  stopping=lambda: False)

    assert clock.now >= 1001.0
    assert len(beats) == clock.sleeps > 1


def test_a_stopping_island_does_not_wait_for_the_restarts_end(island, clock):
    restarts = WholeJobRestarts(Restarts(), inner_steps=4)

    restarts.join(island, until=clock.now + 60, beat=lambda: None, stopping=lambda: True)

    assert clock.sleeps == 0
