"""syncd's batched database rows: events (pushed to live pages after they are
written), island states, the metric history, and the merges a killed syncd
published but never wrote."""

import pytest
from asgiref.sync import async_to_sync

from syncd.live import status_group
from webapp.runs.lifecycle import create_run
from webapp.runs.models import Checkpoint, Event, Metric, Run
from webapp.runs.records import DatabaseRecorder

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

STATUS = {"tokens_merged": 4096, "outer_steps": 3, "versions": [3, 4], "goodput": 0.9,
          "uptime": 1.0, "train_loss": 2.5, "eval_loss": None, "alive_islands": 2,
          "islands": {"a": {"state": "training", "fault": "none", "tokens": 2048,
                            "tokens_per_s": 900.0, "bytes_up": 10, "bytes_down": 20,
                            "emulated_bytes_up": 10, "emulated_bytes_down": 20,
                            "goodput": 0.9, "loss": 2.5}}}


@pytest.fixture
def run():
    return create_run(name="recorded", mode="decoupled", config={}, user=None)


def test_it_keeps_one_metric_point_per_interval_of_its_clock(run):
    recorder = DatabaseRecorder(run.pk, metric_every_s=2.0)

    for now in (10.0, 11.0, 12.0, 13.9, 14.0):
        recorder.metric(STATUS, now)
    recorder.flush()

    points = list(Metric.objects.filter(run=run))
    assert len(points) == 3  # at 10, 12 and 14
    point = points[0]
    assert (point.tokens, point.outer_steps, point.versions, point.goodput) == (
        4096, 3, [3, 4], 0.9)
    assert point.islands["a"]["tokens_per_s"] == 900.0
    assert "loss" not in point.islands["a"]


def test_a_metric_point_keeps_the_evaluation_with_the_tokens_of_its_model(run):
    recorder = DatabaseRecorder(run.pk)
    recorder.metric({**STATUS, "eval_loss": 2.0, "eval_tokens": 3072, "eval_bpb": 2.885}, 1.0)
    recorder.flush()

    point = Metric.objects.get(run=run)
    assert (point.eval_loss, point.eval_tokens, point.eval_bpb) == (2.0, 3072, 2.885)
    assert point.to_dict()["eval_tokens"] == 3072 and point.to_dict()["eval_bpb"] == 2.885


def test_flushed_events_are_pushed_to_the_runs_live_pages(run, channel_layer):
    channel = async_to_sync(channel_layer.new_channel)()
    async_to_sync(channel_layer.group_add)(status_group(run.pk), channel)
    recorder = DatabaseRecorder(run.pk)
    recorder.event("island_lost", "island-0", silent_s=11.0)

    recorder.flush()

    message = async_to_sync(channel_layer.receive)(channel)
    [event] = message["events"]
    assert message["type"] == "run.events"
    assert event["id"] == Event.objects.get(kind="island_lost").pk
    assert (event["island"], event["detail"]) == ("island-0", {"silent_s": 11.0})


def test_the_merges_a_killed_syncd_never_wrote_are_recorded_once_by_the_next():
    run = create_run(name="recovered", mode="decoupled", config={}, user=None)
    Event.objects.create(run=run, kind="merge", detail={"fragment": 0, "version": 1,
                                                        "tokens": 64, "weights": {"a": 1.0}})
    recorder = DatabaseRecorder(run.pk)

    recovered = recorder.recover_merges({0: 3, 1: 2}, {0: 192, 1: 128})
    recorder.flush()

    assert recovered == [0, 1]
    merges = {e.detail["fragment"]: e.detail for e in run.events.filter(
        kind="merge", detail__reason="recovered")}
    assert merges[0] | {"weights": {}} == {"fragment": 0, "version": 3, "tokens": 128,
                                           "weights": {}, "reason": "recovered",
                                           "after_version": 1}
    assert merges[1]["version"] == 2 and merges[1]["tokens"] == 128
    assert DatabaseRecorder(run.pk).recover_merges({0: 3, 1: 2}, {0: 192, 1: 128}) == []


def test_rotation_keeps_a_checkpoint_another_run_was_created_from(run):
    recorder = DatabaseRecorder(run.pk)
    assert recorder.checkpoint([1], "/ck/1", "a" * 64, 10, None, keep=1) == []
    first = Checkpoint.objects.get(path="/ck/1")
    other = create_run(name="from here", mode="decoupled", config={}, user=None)
    Run.objects.filter(pk=other.pk).update(initial_checkpoint=first)

    assert recorder.checkpoint([2], "/ck/2", "b" * 64, 10, None, keep=1) == []
    assert recorder.checkpoint([3], "/ck/3", "c" * 64, 10, None, keep=1) == ["/ck/2"]
    assert set(Checkpoint.objects.values_list("path", flat=True)) == {"/ck/1", "/ck/3"}


def test_recovery_sums_the_recorded_merges_in_the_database_rollbacks_included():
    run = create_run(name="summed", mode="decoupled", config={}, user=None)
    Event.objects.bulk_create(
        Event(run=run, kind="merge", detail={"fragment": i % 2, "version": i // 2 + 1,
                                             "tokens": 10, "weights": {}})
        for i in range(400))
    Event.objects.create(run=run, kind="rollback", detail={"versions": [250, 7]})
    recorder = DatabaseRecorder(run.pk)

    recovered = recorder.recover_merges({0: 251, 1: 200}, {0: 2500, 1: 2000})
    recorder.flush()

    assert recovered == [0]
    [merge] = run.events.filter(kind="merge", detail__reason="recovered")
    assert (merge.detail["after_version"], merge.detail["tokens"]) == (250, 500)
