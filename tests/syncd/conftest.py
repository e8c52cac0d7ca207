"""The run most of syncd's tests drive: decoupled, two islands (tests/syncd/runs.py)."""

import pytest

from tests.syncd.runs import make_run_sync


@pytest.fixture
def run_sync(redis_url, tmp_path):
    return make_run_sync(redis_url, tmp_path, "decoupled")
