"""Fixtures of the run tests: a running run of three islands on the tests' own Redis
(tests/fixtures.py), its island tasks recorded instead of sent, and the run stores."""

import pytest

from syncd.connection import connect
from syncd.store import RunStore
from tests.fixtures import running  # noqa: F401 - a fixture, found by name
from webapp.runs.models import Run


@pytest.fixture
def store(redis_url):
    def for_run(run: Run) -> RunStore:
        return RunStore(connect(redis_url), run.pk)

    return for_run

