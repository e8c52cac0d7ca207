"""The runs resumed after a restart of the web side (webapp/runs/restart.py), against
a real Redis (the tests' own) and the real database.

Island tasks are recorded instead of sent (the `enqueued` fixture): what a region's
worker then does with one is the supervisor's business (tests/trainer).
"""

import pytest

from tests.webapp.runs.three_islands import THREE_ISLANDS, commands
from webapp.runs.lifecycle import create_run, pause_run, start_run, stop_run
from webapp.runs.restart import resume_after_restart

pytestmark = [pytest.mark.django_db, pytest.mark.integration]


def test_resume_after_restart_runs_every_alive_island_again_with_its_next_epoch(
        running, store, enqueued, operator):
    paused = create_run(name="p", mode="decoupled", config=THREE_ISLANDS, user=operator)
    start_run(paused, operator)
    pause_run(paused, operator)
    done = create_run(name="d", mode="decoupled", config=THREE_ISLANDS, user=operator)
    start_run(done, operator)
    stop_run(done, operator)
    for run in (running, paused):
        commands(store(run), "east-a")
    enqueued.clear()

    resumed = resume_after_restart()

    assert [r.pk for r in resumed] == [running.pk, paused.pk]
    assert [(call["args"][0], call["args"][2]) for call in enqueued] == (
        [(running.pk, 2)] * 3 + [(paused.pk, 2)] * 3)
    assert store(running).epochs() == {"east-a": 2, "east-b": 2, "west-a": 2}
    # A paused run stays paused: its new island processes freeze as they start.
    assert commands(store(paused), "east-a") == [{"kind": "pause", "epoch": 2}]
    assert commands(store(running), "east-a") == []
