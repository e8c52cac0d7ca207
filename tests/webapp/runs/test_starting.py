"""A start in two parts (webapp/runs/starting.py): what answers the request, and the
rest on the control worker, against a real Redis (the tests' own) and the database.

Island tasks and the starts queued for the control worker are recorded instead of sent.
"""

import pytest

from tests.webapp.runs.three_islands import THREE_ISLANDS
from webapp.runs.lifecycle import create_run, request_start
from webapp.runs.models import Run
from webapp.runs.restart import resume_after_restart
from webapp.runs.starting import finish_start, finish_start_task

pytestmark = [pytest.mark.django_db, pytest.mark.integration]


@pytest.fixture
def starts(monkeypatch):
    queued: list[list] = []
    monkeypatch.setattr(finish_start_task, "apply_async",
                        lambda args=None, **options: queued.append(args))
    return queued


def test_a_requested_start_leaves_the_run_queued_with_its_spec_and_epochs_published(
        redis_url, store, enqueued, starts, operator):
    run = create_run(name="r", mode="decoupled", config=THREE_ISLANDS, user=operator)

    request_start(run, operator)

    run.refresh_from_db()
    assert (run.state, run.start_progress) == (Run.State.QUEUED, "queued")
    assert store(run).epochs() == {"east-a": 1, "east-b": 1, "west-a": 1}
    assert enqueued == [] and starts == [[run.pk, operator.pk, False]]


def test_a_queued_run_is_started_again_after_a_restart_each_island_at_its_next_epoch(
        redis_url, store, enqueued, starts, operator, settings):
    settings.ISLAND_POOL_FILL_WAIT_S = 0
    run = create_run(name="r", mode="decoupled", config=THREE_ISLANDS, user=operator)
    request_start(run, operator)  # its task died with the control worker

    resume_after_restart()
    assert starts[-1] == [run.pk, None, True]
    finish_start_task(*starts[-1])
    finish_start_task(*starts[0])  # the first try, should it still come: nothing

    run.refresh_from_db()
    assert (run.state, run.start_progress) == (Run.State.RUNNING, "started")
    assert [(task["args"][1], task["args"][2]) for task in enqueued] == [
        ("east-a", 2), ("east-b", 2), ("west-a", 2)]
    assert store(run).epochs() == {"east-a": 2, "east-b": 2, "west-a": 2}


def test_a_start_that_fails_on_the_worker_fails_the_run_with_the_reason(
        redis_url, enqueued, starts, operator, monkeypatch):
    run = create_run(name="r", mode="decoupled", config=THREE_ISLANDS, user=operator)
    request_start(run, operator)

    def broken(*args, **kwargs):
        raise ConnectionError("the pools cannot be read")

    monkeypatch.setattr("webapp.runs.starting.wait_for_standbys", broken)
    with pytest.raises(ConnectionError):
        finish_start(run, operator)

    run.refresh_from_db()
    assert run.state == Run.State.FAILED
    assert run.failure_reason == "The run could not be started: the pools cannot be read"
    assert run.start_progress == "filling_pools"
