"""Each island's life through the API: GET /api/runs/<id>/timeline for every island,
GET /api/runs/<id>/islands/<name>/timeline for one, built from the run's events and
metric rows."""

from datetime import UTC, datetime, timedelta

import pytest

from webapp.runs.models import Event, Island, Metric

pytestmark = [pytest.mark.django_db, pytest.mark.integration]

T0 = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


@pytest.fixture
def killed_and_rejoined(running):
    """east-a killed at 10 s, lost at 13 s, rejoin asked at 15 s, training at 20 s, its
    first merge at 22 s; the run finished at 30 s."""
    island = Island.objects.get(run=running, name="east-a")
    for seconds, kind, detail in (
            (10, "fault", {"fault": "kill", "epoch": 1}), (13, "island_lost", {}),
            (15, "rejoin", {"from_epoch": 1, "epoch": 2}), (18, "island_revived", {}),
            (20, "rejoin", {"epoch": 2, "seconds_to_first_step": 5.0})):
        Event.objects.create(run=running, island=island, kind=kind, time=at(seconds),
                             detail=detail)
    Event.objects.create(run=running, kind="merge", time=at(22),
                         detail={"fragment": 0, "version": 3, "weights": {"east-a": 0.5}})
    for seconds, state in ((0, "training"), (14, "lost"), (20, "training")):
        Metric.objects.create(run=running, time=at(seconds), tokens=0, outer_steps=0,
                              islands={"east-a": {"state": state, "fault": "none"}})
    running.finished_at = at(30)
    running.save()
    return running


def test_the_timeline_of_an_island_has_its_lost_span_with_its_recovery(
        viewer_api, killed_and_rejoined):
    response = viewer_api.get(f"/api/runs/{killed_and_rejoined.pk}/islands/east-a/timeline")

    assert response.status_code == 200
    body = response.json()
    assert body["end"] == at(30).timestamp()
    (lane,) = body["islands"]
    assert [(s["state"], s["start"] - T0.timestamp()) for s in lane["spans"]] == [
        ("training", 0), ("lost", 13), ("rejoining", 15), ("training", 18)]
    assert lane["spans"][1]["recovery"]["seconds"] == {
        "fault": 0, "lost": 3, "rejoin": 5, "first_step": 10, "first_merge": 12}
    assert [m["kind"] for m in lane["marks"]] == ["fault", "rejoin", "rejoin", "merge"]


def test_the_runs_timeline_has_a_lane_for_each_island(viewer_api, killed_and_rejoined):
    response = viewer_api.get(f"/api/runs/{killed_and_rejoined.pk}/timeline")

    assert response.status_code == 200
    assert [lane["island"] for lane in response.json()["islands"]] == [
        "east-a", "east-b", "west-a"]


def test_the_timeline_of_an_island_the_run_does_not_have_is_404(viewer_api, running):
    response = viewer_api.get(f"/api/runs/{running.pk}/islands/nowhere/timeline")

    assert response.status_code == 404


def test_the_timeline_needs_a_signed_in_user(anonymous_api, running):
    assert anonymous_api.get(f"/api/runs/{running.pk}/timeline").status_code == 401


def test_the_timeline_since_a_time_has_only_what_is_from_then_on(viewer_api,
                                                                 killed_and_rejoined):
    since = at(16).timestamp()
    response = viewer_api.get(
        f"/api/runs/{killed_and_rejoined.pk}/islands/east-a/timeline?since={since}")

    assert response.status_code == 200
    body = response.json()
    assert body["since"] == since
    (lane,) = body["islands"]
    assert [(s["state"], s["start"] - T0.timestamp()) for s in lane["spans"]] == [
        ("rejoining", 16), ("training", 18)]
    assert lane["spans"][0]["recovery"]["seconds"]["first_merge"] == 12
    assert [(m["kind"], m["time"] - T0.timestamp()) for m in lane["marks"]] == [
        ("rejoin", 20), ("merge", 22)]


@pytest.mark.parametrize("since", ["-1", "1e300", "nan", "soon"])
def test_a_timeline_since_no_time_is_refused_by_its_field(viewer_api, running, since):
    response = viewer_api.get(f"/api/runs/{running.pk}/timeline?since={since}")

    assert response.status_code == 422
    assert list(response.json()["errors"]) == ["since"]
