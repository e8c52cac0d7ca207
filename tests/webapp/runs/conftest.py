"""Fixtures of the run tests: a running run of three islands on the tests' own Redis,
its island tasks recorded instead of sent, and the run stores."""

import pytest

from syncd.connection import connect
from syncd.store import RunStore
from tests.webapp.runs.three_islands import THREE_ISLANDS
from webapp.runs.models import Run
from webapp.runs.services import create_run, start_run


@pytest.fixture
def store(redis_url):
    def for_run(run: Run) -> RunStore:
        return RunStore(connect(redis_url), run.pk)

    return for_run


@pytest.fixture
def running(redis_url, enqueued, operator) -> Run:
    run = create_run(name="r", mode="decoupled", config=THREE_ISLANDS, user=operator)
    start_run(run, operator)
    enqueued.clear()
    return run
