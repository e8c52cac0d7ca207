"""What a run looks like to its readers (webapp.runs.reports): the row joined with
syncd's status, its progress, its history, its events and its timeline."""

from datetime import timedelta

import pytest
from django.utils import timezone

from webapp.runs.models import Event, Island, Metric, Run
from webapp.runs.reports import (
    RUN_FIELDS,
    progress,
    run_events,
    run_metrics,
    run_summary,
    run_timeline,
)
from webapp.runs.timeline import lane_since

pytestmark = pytest.mark.django_db

CONFIG = {"budget": {"total_tokens": 1000},
          "islands": [{"name": "a", "region": "us-east"}, {"name": "b", "region": "us-west"}]}


@pytest.fixture
def run() -> Run:
    run = Run.objects.create(name="read", mode="decoupled", config=CONFIG,
                             state=Run.State.RUNNING, tokens=250)
    for island in CONFIG["islands"]:
        Island.objects.create(run=run, state=Island.State.TRAINING, tokens=40, **island)
    return run


def test_progress_is_the_tokens_merged_against_the_budget_and_never_above_one(run):
    assert progress(run) == 0.25
    run.tokens = 5000
    assert progress(run) == 1.0
    run.config = {}
    assert progress(run) == 0.0


def test_a_run_syncd_has_not_served_yet_has_no_versions_and_no_live_figures(run):
    summary = run_summary(run, status={})

    assert summary["versions"] == {} and summary["progress"] == 0.25
    assert all(summary[field] is None for field in RUN_FIELDS)
    a = summary["islands"][0]
    assert (a["fault"], a["version_lag"], a["tokens"]) == ("none", 0, 40)
    assert a["link"]["bytes_up"] == 0


def test_a_running_runs_summary_takes_syncds_live_figures_and_island_states(run):
    status = {"versions": [3, 2], "goodput": 0.9,
              "islands": {"a": {"state": "lost", "fault": "partition", "version_lag": 2,
                                "tokens": 64, "link": {"state": "cut"}}}}

    summary = run_summary(run, status=status)

    assert summary["versions"] == {"0": 3, "1": 2} and summary["goodput"] == 0.9
    a, b = summary["islands"]
    assert (a["state"], a["fault"], a["version_lag"], a["tokens"]) == (
        "lost", "partition", 2, 64)
    assert a["link"] == {"state": "cut"}
    assert (b["state"], b["tokens"]) == ("training", 40)


def test_each_islands_backpressure_and_upload_slot_waits_come_from_syncds_status(run):
    status = {"islands": {"a": {"backpressure_wait_s": 2.5, "slot_wait_s": 0.75}}}

    a, b = run_summary(run, status=status)["islands"]

    assert (a["backpressure_wait_s"], a["slot_wait_s"]) == (2.5, 0.75)
    assert (b["backpressure_wait_s"], b["slot_wait_s"]) == (0.0, 0.0)  # no live figures


def test_an_ended_runs_islands_keep_their_own_state(run):
    run.state = Run.State.COMPLETED
    status = {"islands": {"a": {"state": "training", "link": {"state": "cut"}}}}

    a = run_summary(run, status=status)["islands"][0]

    assert a["state"] == "training"  # the island's row's state
    assert a["link"]["state"] != "cut"


def test_history_points_come_oldest_first_after_a_time_and_up_to_a_limit(run):
    now = timezone.now()
    for minutes in (3, 1, 2):
        Metric.objects.create(run=run, time=now - timedelta(minutes=minutes),
                              tokens=minutes, outer_steps=minutes)

    assert [p["tokens"] for p in run_metrics(run)] == [3, 2, 1]
    assert [p["tokens"] for p in run_metrics(run, since=now - timedelta(minutes=2.5))] == [2, 1]
    assert [p["tokens"] for p in run_metrics(run, limit=1)] == [3]
    assert [p["tokens"] for p in run_metrics(run, limit=2, newest=True)] == [2, 1]


def test_events_come_oldest_first_after_an_id_of_a_kind_with_their_islands_names(run):
    a = run.islands.get(name="a")
    first = Event.objects.create(run=run, kind=Event.Kind.FAULT, island=a,
                                 detail={"fault": "straggle"})
    Event.objects.create(run=run, kind=Event.Kind.MERGE, detail={"fragment": 0})
    Event.objects.create(run=run, kind=Event.Kind.FAULT, detail={"fault": "degrade"})

    assert [e["kind"] for e in run_events(run)] == ["fault", "merge", "fault"]
    assert [e["kind"] for e in run_events(run, after_id=first.pk)] == ["merge", "fault"]
    assert len(run_events(run, kind="fault")) == 2 and len(run_events(run, limit=1)) == 1
    assert run_events(run)[0]["island"] == "a"


def test_the_timeline_has_a_lane_per_island_from_the_runs_start_to_its_end(run):
    started = timezone.now() - timedelta(minutes=10)
    run.started_at, run.finished_at = started, started + timedelta(minutes=5)
    Event.objects.create(run=run, kind=Event.Kind.FAULT, island=run.islands.get(name="b"),
                         time=started + timedelta(minutes=1), detail={"fault": "straggle"})

    timeline = run_timeline(run)

    assert timeline["start"] == pytest.approx(started.timestamp())
    assert timeline["end"] == pytest.approx((started + timedelta(minutes=5)).timestamp())
    assert len(timeline["islands"]) == 2
    assert len(run_timeline(run, islands=["b"])["islands"]) == 1


def test_the_timeline_since_a_time_is_the_whole_timelines_part_from_then_on(run):
    """a killed at 10 s, lost at 13, rejoin asked at 15, back at 18, training at 20, its
    first merge at 22; metric rows every 2 s; the page asks since 16.5 s."""
    started = timezone.now() - timedelta(minutes=10)
    run.started_at, run.finished_at = started, started + timedelta(seconds=40)
    a = run.islands.get(name="a")
    for seconds, kind, detail in (
            (10, "fault", {"fault": "kill", "epoch": 1}), (13, "island_lost", {}),
            (15, "rejoin", {"from_epoch": 1, "epoch": 2}), (18, "island_revived", {}),
            (20, "rejoin", {"epoch": 2, "seconds_to_first_step": 5.0})):
        Event.objects.create(run=run, island=a, kind=kind, detail=detail,
                             time=started + timedelta(seconds=seconds))
    for seconds in (4, 22, 30):
        Event.objects.create(run=run, kind="merge", time=started + timedelta(seconds=seconds),
                             detail={"fragment": 0, "version": seconds,
                                     "weights": {"a": 0.5, "b": 0.5}})
    for seconds in range(0, 40, 2):
        state = "lost" if 13 <= seconds < 18 else "training"
        Metric.objects.create(run=run, time=started + timedelta(seconds=seconds), tokens=0,
                              outer_steps=0, islands={"a": {"state": state},
                                                      "b": {"state": "training"}})
    since = (started + timedelta(seconds=16.5)).timestamp()

    whole, newer = run_timeline(run), run_timeline(run, since=since)

    assert whole["since"] is None and newer["since"] == since
    assert newer["end"] == whole["end"]
    assert newer["islands"] == [lane_since(lane, since) for lane in whole["islands"]]
    lane = newer["islands"][0]
    assert [(s["state"], round(s["start"] - since, 1)) for s in lane["spans"]] == [
        ("rejoining", 0.0), ("training", 1.5)]
    # The outage began before `since`: its cause and recovery are still whole.
    assert lane["spans"][0]["recovery"]["seconds"] == {
        "fault": 0.0, "lost": 3.0, "rejoin": 5.0, "first_step": 10.0, "first_merge": 12.0}
    assert all(m["time"] >= since for m in lane["marks"])
    assert [m["kind"] for m in lane["marks"]] == ["rejoin", "merge", "merge"]


def test_the_timeline_since_a_time_takes_the_islands_states_from_the_row_before_it(run):
    started = timezone.now() - timedelta(minutes=10)
    run.started_at, run.finished_at = started, started + timedelta(seconds=20)
    for seconds, state in ((0, "starting"), (4, "training")):
        Metric.objects.create(run=run, time=started + timedelta(seconds=seconds), tokens=0,
                              outer_steps=0, islands={"a": {"state": state}})
    since = (started + timedelta(seconds=10)).timestamp()

    (lane, _) = run_timeline(run, since=since)["islands"]

    assert [(s["state"], s["start"]) for s in lane["spans"]] == [("training", since)]
