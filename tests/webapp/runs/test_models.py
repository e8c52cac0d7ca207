import pytest
from django.db import IntegrityError, transaction

from diloco.config import RunConfig
from webapp.runs.models import TRANSITIONS, Event, Island, Run, WrongState

pytestmark = pytest.mark.django_db


def make_run(**fields) -> Run:
    return Run.objects.create(name="tiny", config=RunConfig().to_dict(), **fields)


def test_a_new_run_is_a_draft_with_its_own_secret():
    first, second = make_run(), make_run()

    assert first.state == Run.State.DRAFT
    assert len(first.secret) == 64
    assert set(first.secret) <= set("0123456789abcdef")
    assert first.secret != second.secret


def test_transition_moves_the_run_and_records_who_asked(operator):
    run = make_run()

    run.transition(Run.State.QUEUED, by=operator)

    run.refresh_from_db()
    assert run.state == Run.State.QUEUED
    event = run.events.get()
    assert event.kind == Event.Kind.RUN_STATE
    assert event.actor == operator
    assert event.detail == {"from": "draft", "to": "queued", "reason": ""}


def test_it_sets_started_at_once_and_finished_at_on_a_final_state():
    run = make_run()
    run.transition("queued")
    run.transition("running")
    started = run.started_at
    run.transition("paused")
    run.transition("running")
    assert run.started_at == started
    assert run.finished_at is None

    run.transition("completed")

    run.refresh_from_db()
    assert run.started_at == started
    assert run.finished_at is not None and run.finished_at >= started


def test_it_keeps_the_reason_of_a_failure():
    run = make_run(state=Run.State.RUNNING)

    run.transition(Run.State.FAILED, reason="syncd lost its checkpoint")

    run.refresh_from_db()
    assert run.failure_reason == "syncd lost its checkpoint"


def test_it_rejects_leaving_a_final_state():
    run = make_run(state=Run.State.COMPLETED)

    with pytest.raises(WrongState, match="cannot go from completed to running"):
        run.transition(Run.State.RUNNING)

    run.refresh_from_db()
    assert run.state == Run.State.COMPLETED
    assert not run.events.exists()


def test_it_names_the_allowed_states_when_it_rejects_a_transition():
    run = make_run()

    with pytest.raises(WrongState, match="from draft a run can go to queued"):
        run.transition(Run.State.RUNNING)


def test_it_checks_the_stored_state_not_a_stale_copy():
    run = make_run(state=Run.State.RUNNING)
    Run.objects.filter(pk=run.pk).update(state=Run.State.STOPPED)

    with pytest.raises(WrongState, match="cannot go from stopped to paused"):
        run.transition(Run.State.PAUSED)


def test_it_rejects_an_unknown_state():
    run = make_run()

    with pytest.raises(ValueError):
        run.transition("exploded")


def test_the_final_states_are_those_no_transition_leaves():
    assert set(Run.FINAL) == {state for state, allowed in TRANSITIONS.items() if not allowed}


def test_the_named_sets_of_states_select_their_runs():
    runs = {state: make_run(state=state) for state in Run.State}

    assert set(Run.objects.admitted()) == {runs[state] for state in Run.ADMITTED}
    assert set(Run.objects.under_way()) == {runs[state] for state in Run.UNDER_WAY}
    assert set(Run.objects.running_or_paused()) == {runs[state] for state in Run.RUNNING_OR_PAUSED}
    assert [s for s, run in runs.items() if run.is_under_way] == list(Run.UNDER_WAY)
    assert [s for s, run in runs.items() if run.is_running_or_paused] == list(Run.RUNNING_OR_PAUSED)


def test_run_config_returns_the_stored_config():
    config = RunConfig()
    config.sync.min_quorum = 1
    run = Run.objects.create(name="tiny", config=config.to_dict())

    assert run.run_config() == config


def test_run_config_reads_a_run_whose_region_was_retired(settings):
    config = RunConfig().to_dict()
    config["islands"][0]["region"] = "eu-north"
    run = Run.objects.create(name="old", config=config)
    settings.REGIONS = ["us-east"]

    assert run.run_config().islands[0].region == "eu-north"


def test_to_dict_leaves_the_secret_out():
    run = make_run()
    Island.objects.create(run=run, name="island-0", region="us-east")

    data = run.to_dict()

    assert run.secret not in str(data)
    assert "secret" not in data
    assert [island["name"] for island in data["islands"]] == ["island-0"]


def test_island_names_are_unique_within_a_run():
    run = make_run()
    Island.objects.create(run=run, name="island-0", region="us-east")

    with pytest.raises(IntegrityError), transaction.atomic():
        Island.objects.create(run=run, name="island-0", region="us-west")


def test_two_runs_may_have_islands_of_the_same_name():
    Island.objects.create(run=make_run(), name="island-0", region="us-east")
    Island.objects.create(run=make_run(), name="island-0", region="us-east")

    assert Island.objects.filter(name="island-0").count() == 2


def test_a_new_island_is_pending_without_a_fault_in_epoch_zero():
    island = Island.objects.create(run=make_run(), name="island-0", region="us-east")

    assert (island.state, island.fault, island.epoch) == ("pending", "none", 0)
    assert Island._meta.get_field("fault").verbose_name == "active fault"


def test_events_come_in_time_order():
    run = make_run()
    later = Event.objects.create(run=run, kind=Event.Kind.MERGE)
    earlier = Event.objects.create(run=run, kind=Event.Kind.ALERT,
                                   time=later.time.replace(year=later.time.year - 1))

    assert list(run.events.all()) == [earlier, later]


def test_the_islands_a_run_has_now_are_those_of_its_config():
    run = make_run()
    Island.objects.create(run=run, name="removed", region="us-east")
    for name in ("island-0", "island-1"):
        Island.objects.create(run=run, name=name, region="us-east")

    assert run.island_names() == ["island-0", "island-1"]
    assert [island.name for island in run.current_islands()] == ["island-0", "island-1"]
    assert [island["name"] for island in run.to_dict()["islands"]] == ["island-0", "island-1"]


def test_get_island_names_the_islands_there_are_when_it_has_no_such_one():
    run = make_run()
    island = Island.objects.create(run=run, name="island-0", region="us-east")
    Island.objects.create(run=run, name="removed", region="us-east")

    assert run.get_island("island-0") == island
    assert run.get_island(island) == island
    with pytest.raises(ValueError, match=r"no island named 'removed' \(it has island-0\)"):
        run.get_island("removed")


def test_require_state_reads_the_stored_state_not_a_stale_copy():
    run = make_run()
    Run.objects.filter(pk=run.pk).update(state=Run.State.RUNNING)

    run.require_state((Run.State.RUNNING,), "pause a run")
    with pytest.raises(ValueError, match=r"cannot delete a run: the run is running "
                                         r"\(it must be draft\)"):
        run.require_state((Run.State.DRAFT,), "delete a run")


def test_an_island_event_names_the_island_and_who_asked(operator):
    run = make_run()
    island = Island.objects.create(run=run, name="island-0", region="us-east")

    event = island.record_event(Event.Kind.REJOIN, operator, epoch=2)

    assert (event.run, event.island, event.actor) == (run, island, operator)
    assert event.detail == {"island": "island-0", "epoch": 2}
