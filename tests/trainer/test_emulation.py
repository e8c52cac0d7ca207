"""What an island acts out of its active fault, and its emulated link
(trainer.emulation): a store that holds the island's fault in memory, and a clock of
the tests' own, so that every fault is read when the test says."""

from types import SimpleNamespace

import pytest
import torch

from diloco.config import EmulationConfig, IslandConfig
from trainer import emulation
from trainer.emulation import FAULT_READ_S, FaultEmulation

GBIT = 1e9 / 8  # bytes in one gigabit


class Faults:
    """The island's fault as syncd.island_signals keeps it (the FaultStore protocol)."""

    def __init__(self):
        self.faults: dict[str, dict] = {}
        self.reads = 0

    def fault(self, island: str) -> dict:
        self.reads += 1
        return dict(self.faults.get(island, {}))

    def clear_fault(self, island: str) -> None:
        self.faults.pop(island, None)


@pytest.fixture
def clock(monkeypatch):
    """The emulation's time: now, and the sleeps it takes (each one runs `on_sleep`)."""
    state = SimpleNamespace(now=1000.0, sleeps=0, on_sleep=lambda: None)

    def sleep(seconds: float) -> None:
        state.now += seconds
        state.sleeps += 1
        state.on_sleep()

    monkeypatch.setattr(emulation, "time", SimpleNamespace(time=lambda: state.now, sleep=sleep))
    return state


@pytest.fixture
def store():
    return Faults()


def island(store: Faults, speed: float = 1.0, bytes_scale: float = 1.0,
           stopping=lambda: False, link: str = "process") -> FaultEmulation:
    config = IslandConfig(name="a", region="us-east", speed=speed, bandwidth_gbps=2.0,
                          latency_ms=30.0)
    return FaultEmulation(store, "a", config, EmulationConfig(link=link, bytes_scale=bytes_scale),
                          stopping)


def fault(store: Faults, clock, kind: str, **extra) -> None:
    """Set the island's fault and let enough time pass for the island to read it."""
    store.faults["a"] = {"kind": kind, "until": clock.now + 60, **extra}
    clock.now += FAULT_READ_S * 2


def test_a_message_takes_the_links_latency_plus_its_bits_over_its_bandwidth(store, clock):
    link = island(store)

    assert link.transfer_time(0) == pytest.approx(0.030)
    assert link.transfer_time(int(2 * GBIT)) == pytest.approx(0.030 + 1.0)


def test_the_bytes_scale_counts_a_message_that_many_times(store, clock):
    assert island(store, bytes_scale=10).transfer_time(int(0.2 * GBIT)) == pytest.approx(
        0.030 + 1.0)


def test_with_no_emulated_link_a_message_is_held_for_no_time_even_when_degraded(store, clock):
    link = island(store, link="none")
    assert link.transfer_time(int(2 * GBIT)) == 0.0
    fault(store, clock, "degrade", factor=4.0)
    assert link.transfer_time(int(2 * GBIT)) == 0.0


def test_with_no_emulated_link_a_partition_still_holds_the_island(store, clock):
    link = island(store, link="none")
    fault(store, clock, "partition")
    assert link.partitioned()


def test_a_degrade_fault_divides_the_bandwidth_by_its_factor_and_never_multiplies_it(
        store, clock):
    link = island(store)

    fault(store, clock, "degrade", factor=4.0)
    assert link.transfer_time(int(2 * GBIT)) == pytest.approx(0.030 + 4.0)
    fault(store, clock, "degrade", factor=0.5)
    assert link.transfer_time(int(2 * GBIT)) == pytest.approx(0.030 + 1.0)
    fault(store, clock, "degrade")  # no factor: ten times slower
    assert link.transfer_time(int(2 * GBIT)) == pytest.approx(0.030 + 10.0)


def test_a_step_is_slower_by_the_islands_speed_and_by_a_straggle_faults_factor(store, clock):
    link = island(store, speed=0.5)
    assert link.slowdown() == pytest.approx(2.0)

    fault(store, clock, "straggle", factor=3.0)
    assert link.slowdown() == pytest.approx(6.0)
    fault(store, clock, "straggle")  # no factor: four times slower
    assert link.slowdown() == pytest.approx(8.0)
    fault(store, clock, "degrade", factor=3.0)  # not a fault of the step time
    assert link.slowdown() == pytest.approx(2.0)


def test_a_corrupt_fault_poisons_the_floats_of_one_update_then_is_cleared(store, clock):
    link = island(store)
    payload = {"w": torch.ones(3), "index": torch.arange(3)}
    fault(store, clock, "corrupt")

    poisoned = link.corrupt(payload)

    assert torch.isnan(poisoned["w"]).all()
    assert torch.equal(poisoned["index"], torch.arange(3))
    assert "a" not in store.faults
    assert link.corrupt(payload) is payload


def test_without_a_corrupt_fault_the_update_goes_as_it_is(store, clock):
    payload = {"w": torch.ones(3)}
    fault(store, clock, "straggle", factor=2.0)

    assert island(store).corrupt(payload) is payload


def test_a_partition_holds_the_island_until_it_is_lifted(store, clock):
    link = island(store)
    fault(store, clock, "partition")
    assert link.partitioned()

    def lift_after_ten_polls() -> None:
        if clock.sleeps == 10:
            store.faults.clear()
            clock.now += FAULT_READ_S * 2

    clock.on_sleep = lift_after_ten_polls
    link.wait_while_partitioned()

    assert clock.sleeps == 10 and not link.partitioned()


def test_a_partition_lets_a_stopping_island_go(store, clock):
    stopping = SimpleNamespace(now=False)
    link = island(store, stopping=lambda: stopping.now)
    fault(store, clock, "partition")
    clock.on_sleep = lambda: setattr(stopping, "now", clock.sleeps >= 3)

    link.wait_while_partitioned()

    assert clock.sleeps == 3 and link.partitioned()


def test_the_fault_is_read_from_the_store_at_most_every_fault_read_interval(store, clock):
    link = island(store)
    for _ in range(10):
        link.fault()
    assert store.reads == 1

    store.faults["a"] = {"kind": "partition", "until": clock.now + 60}
    assert not link.partitioned()  # not read again yet
    clock.now += FAULT_READ_S * 2
    assert link.partitioned() and store.reads == 2
