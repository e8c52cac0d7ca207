"""The Celery tasks (webapp/runs/tasks.py): the island task starts no island of an
inactive run and no superseded epoch. What it does with a good one is the
supervisor's business (tests/trainer)."""

import pytest

from webapp.runs.lifecycle import stop_run
from webapp.runs.membership import rejoin_island
from webapp.runs.reports import island_log
from webapp.runs.tasks import run_island

pytestmark = [pytest.mark.django_db, pytest.mark.integration]


def test_the_island_task_does_not_start_an_island_of_an_inactive_run(running, redis_url,
                                                                      operator):
    stop_run(running, operator)

    result = run_island(running.pk, "east-a", 1, redis_url, "ab" * 32)

    assert result == {"island": "east-a", "epoch": 1, "exit_code": None, "ended": "inactive"}


def test_the_island_task_does_not_start_a_superseded_epoch(running, redis_url,
                                                                  settings, tmp_path,
                                                                  operator):
    settings.LOG_DIR = tmp_path
    rejoin_island(running, "east-a", operator)

    result = run_island(running.pk, "east-a", 1, redis_url, "ab" * 32)

    assert result == {"island": "east-a", "epoch": 1, "exit_code": None,
                      "ended": "superseded"}
    assert "not started: a newer epoch took over" in island_log(running, "east-a")[-1]
