"""The run services' stores (webapp.runs.stores): on the Redis settings.REDIS_URL names,
one connection pool per URL."""

import pytest

from webapp.runs.models import Run
from webapp.runs.stores import pool_store, redis_client, run_store

pytestmark = pytest.mark.integration


def test_a_runs_store_is_on_the_settings_redis_whether_given_the_run_or_its_id(
        redis_url, db):
    run = Run.objects.create(name="r", mode="decoupled", config={})

    by_run, by_id = run_store(run), run_store(run.pk)

    assert by_run.run_id == by_id.run_id == str(run.pk)
    assert by_run.client is by_id.client is redis_client(redis_url)
    by_run.put_status({"state": "running"})
    assert by_id.status()["state"] == "running"


def test_the_pool_store_is_on_the_settings_redis_too(redis_url):
    assert pool_store().client is redis_client(redis_url)
    assert redis_client(redis_url) is redis_client(redis_url)
