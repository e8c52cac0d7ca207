"""The run most of syncd's tests drive (decoupled, two islands: tests/syncd/runs.py) and a
connection to the tests' Redis."""

import pytest

from syncd.connection import connect
from tests.syncd.runs import make_run_sync


@pytest.fixture
def run_sync(redis_url, tmp_path):
    return make_run_sync(redis_url, tmp_path, "decoupled")


@pytest.fixture
def client(redis_url):
    c = connect(redis_url)
    yield c
    c.close()
