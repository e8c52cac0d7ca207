"""Which chaos actions are due, and what the driver does with them, on a fake clock.

The driver is tested against small fakes of the parts a RunSync hands it (its store,
recorder, spec and liveness view): no Redis, no database, no processes; the
integration test in tests/webapp/runs/ runs it for real.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from diloco.chaos import PRESETS, Fault, schedule
from syncd.chaos_driver import ChaosDriver, ChaosPlan, actions_of
from syncd.records import Heartbeat

FOUR = {"east-a": "us-east", "east-b": "us-east", "west-a": "us-west", "west-b": "us-west"}


def test_a_kill_is_followed_by_its_rejoin_and_other_faults_end_by_themselves():
    faults = [Fault(5.0, "kill", ("east-a",), 10.0), Fault(7.0, "straggle", ("west-a",), 4.0, 4.0)]
    actions = actions_of(faults)
    assert [(a.at_s, a.kind) for a in actions] == [(5.0, "fault"), (7.0, "fault"),
                                                    (15.0, "rejoin")]


def test_at_the_same_instant_the_rejoin_comes_first():
    faults = [Fault(10.0, "partition", ("west-a",), 5.0), Fault(0.0, "kill", ("east-a",), 10.0)]
    assert [a.kind for a in actions_of(faults)] == ["fault", "rejoin", "fault"]


def test_nothing_is_due_before_its_time_and_everything_is_due_once():
    plan = ChaosPlan("aggressive", FOUR, seed=1)
    first = plan.actions[0].at_s
    assert plan.due(first - 0.001, done=0) == []
    due = plan.due(first, done=0)
    assert due == [plan.actions[0]]
    assert plan.due(first, done=1) == []


def test_a_driver_that_fell_behind_gets_every_missed_action_in_order():
    plan = ChaosPlan("aggressive", FOUR, seed=2)
    due = plan.due(300.0, done=0)
    assert due == [a for a in plan.actions if a.at_s <= 300.0]
    assert [a.at_s for a in due] == sorted(a.at_s for a in due)
    assert any(a.kind == "rejoin" for a in due)


def test_the_schedule_goes_on_past_its_horizon_without_changing_what_came_before():
    plan = ChaosPlan("kills_only", FOUR, seed=3, horizon_s=100.0)
    early = list(plan.due(40.0, done=0))
    later = plan.due(1000.0, done=0)
    assert plan.horizon_s > 1000.0
    assert later[:len(early)] == early
    assert [a.fault for a in later if a.kind == "fault"] == [
        f for f in schedule(PRESETS["kills_only"], FOUR, 1000.0, 3) if f.at_s <= 1000.0]


def test_the_same_seed_gives_the_same_plan_in_both_modes():
    assert ChaosPlan("moderate", FOUR, 9).actions == ChaosPlan("moderate", FOUR, 9).actions


@pytest.mark.parametrize("args, message", [
    (("gentle", FOUR, 0), "unknown chaos preset 'gentle'"),
    (("aggressive", FOUR, 0, 0.0), "horizon_s must be positive"),
])
def test_it_rejects_a_bad_plan(args, message):
    with pytest.raises(ValueError, match=message):
        ChaosPlan(*args)


# -- the driver, on fakes -------------------------------------------------------------


class FakeStore:
    """The chaos schedule's progress and the fault keys, in memory."""

    run_id = "7"

    def __init__(self):
        self.chaos: dict[str, str] = {}
        self.faults: dict[str, tuple[str, float, float, float]] = {}
        self.commands: list[tuple[str, str, dict]] = []
        self.control = self.signals = self  # the parts of a RunStore it stands in for

    def chaos_progress(self):
        return dict(self.chaos)

    def start_chaos(self, start, islands):
        self.chaos.update(start=str(start), done="0", islands=json.dumps(islands))

    def set_chaos_done(self, done):
        self.chaos["done"] = str(done)

    def set_fault(self, island, kind, until, factor, seconds):
        self.faults[island] = (kind, until, factor, seconds)

    def send_command(self, island, kind, **args):
        self.commands.append((island, kind, args))


class FakeRecorder:
    def __init__(self):
        self.events: list[tuple[str, str | None, dict]] = []

    def event(self, kind, island=None, **detail):
        self.events.append((kind, island, detail))


def fake_run(preset="kills_only", seed=0):
    """What a RunSync hands its driver: the store, recorder and spec, and the liveness
    view it ticks with."""
    islands = [SimpleNamespace(name=n, region=r) for n, r in FOUR.items()]
    config = SimpleNamespace(chaos=SimpleNamespace(preset=preset, seed=seed), islands=islands)
    spec = SimpleNamespace(config=config, island_names=lambda: set(FOUR))
    liveness = SimpleNamespace(alive=0, heartbeats={}, epochs=dict.fromkeys(FOUR, 1))
    return SimpleNamespace(store=FakeStore(), recorder=FakeRecorder(), spec=spec,
                           liveness=liveness)


def driver_of(run):
    """The driver of a run that syncd took at 1000.0."""
    return ChaosDriver.for_run(run.store, run.recorder, run.spec, None, since=1000.0)


def everyone_trains(run):
    run.liveness.alive = len(FOUR)
    run.liveness.heartbeats = {n: Heartbeat.bare(1, 0.0, 0, 0) for n in FOUR}


def test_a_run_without_a_preset_gets_no_driver():
    assert driver_of(fake_run(preset="none")) is None


def test_the_clock_starts_when_every_island_trains():
    run = fake_run()
    driver = driver_of(run)
    driver.tick(1010.0, run.liveness)
    assert driver.start is None
    everyone_trains(run)
    driver.tick(1012.0, run.liveness)
    assert driver.start == 1012.0
    assert json.loads(run.store.chaos["islands"]) == FOUR


def test_the_clock_starts_anyway_when_an_island_never_comes(monkeypatch):
    run = fake_run()
    driver = driver_of(run)
    driver.tick(1000.0 + 119.0, run.liveness)
    assert driver.start is None
    driver.tick(1000.0 + 120.0, run.liveness)
    assert driver.start == 1120.0


def test_a_due_kill_goes_to_the_supervisor_with_the_epoch_and_is_an_event(monkeypatch):
    run = fake_run("kills_only", seed=4)
    everyone_trains(run)
    driver = driver_of(run)
    rejoined = []
    monkeypatch.setattr(driver, "_rejoin", lambda action: rejoined.append(action))
    driver.tick(2000.0, run.liveness)
    first = driver.plan.actions[0]
    driver.tick(2000.0 + first.at_s + 0.01, run.liveness)
    (island,) = first.fault.islands
    # A kill's supervisor reports the death at once.
    assert run.store.commands == [(island, "kill", {"epoch": 1, "report": True})]
    kind, who, detail = run.recorder.events[0]
    assert (kind, who, detail["fault"]) == ("fault", island, "kill")
    assert detail["chaos"] == {"preset": "kills_only", "seed": 4, "at_s": first.at_s}
    assert driver.done == 1 and run.store.chaos["done"] == "1"
    driver.tick(2000.0 + first.fault.ends_s + 0.01, run.liveness)
    assert [a.kind for a in rejoined] == ["rejoin"] and rejoined[0].fault == first.fault


def test_a_region_outage_kills_its_islands_and_holds_their_deaths_back():
    run = fake_run("aggressive", seed=0)
    everyone_trains(run)
    driver = driver_of(run)
    driver.tick(2000.0, run.liveness)
    outage = next(a for a in driver.plan.actions
                  if a.kind == "fault" and a.fault.kind == "region_outage")
    driver._fault(outage, 2500.0, run.liveness.epochs)
    assert run.store.commands == [(i, "kill", {"epoch": 1, "report": False})
                                  for i in outage.fault.islands]


def test_other_faults_set_the_key_the_island_reads():
    run = fake_run("aggressive", seed=0)
    everyone_trains(run)
    driver = driver_of(run)
    driver.tick(0.0 + 2000.0, run.liveness)
    action = next(a for a in driver.plan.actions if a.fault.kind == "straggle")
    driver._fault(action, 2500.0, run.liveness.epochs)
    (island,) = action.fault.islands
    seconds = action.fault.duration_s
    assert run.store.faults[island] == ("straggle", 2500.0 + seconds, 4.0, seconds)
    assert run.recorder.events[-1][2]["fault"] == "straggle"


def test_a_restarted_syncd_goes_on_with_the_next_action(monkeypatch):
    run = fake_run("kills_only", seed=5)
    everyone_trains(run)
    driver = driver_of(run)
    monkeypatch.setattr(driver, "_rejoin", lambda action: None)
    driver.tick(3000.0, run.liveness)
    driver.tick(3000.0 + 200.0, run.liveness)
    done = driver.done
    assert done > 0
    again = driver_of(run)  # syncd came back: same Redis
    assert (again.start, again.done) == (3000.0, done)
    assert again.plan.due(200.0, again.done) == []
