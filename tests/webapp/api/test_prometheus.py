"""/metrics: Prometheus' text format, for a scraper's token or an operator's session."""

import json

import pytest
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from syncd.connection import connect
from syncd.store import RunStore
from webapp.runs.models import Run

pytestmark = [pytest.mark.django_db, pytest.mark.integration]


def scrape(client: Client, **headers):
    return client.get("/metrics", **headers)


def samples(response) -> dict[tuple[str, frozenset], float]:
    """Every sample the exposition holds: (name, labels) -> value."""
    return {sample(s.name, **s.labels): s.value
            for family in text_string_to_metric_families(response.content.decode())
            for s in family.samples}


def sample(metric: str, /, **labels) -> tuple[str, frozenset]:
    return metric, frozenset((key, str(value)) for key, value in labels.items())


def test_anonymous_scrapers_get_401(client, metrics_token):
    response = scrape(client)

    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")


def test_a_wrong_token_gets_401(client, metrics_token):
    assert scrape(client, HTTP_AUTHORIZATION="Bearer wrong").status_code == 401


def test_no_token_is_accepted_when_none_is_set(client, settings):
    settings.METRICS_TOKEN = ""

    assert scrape(client, HTTP_AUTHORIZATION="Bearer ").status_code == 401


def test_a_viewer_gets_403(viewer_client):
    assert scrape(viewer_client).status_code == 403


def test_an_operator_session_may_read_the_metrics(operator_client):
    response = scrape(operator_client)

    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")


def test_an_admin_session_may_read_the_metrics(admin_client):
    assert scrape(admin_client).status_code == 200


def test_the_scraper_reads_the_runs_and_their_alive_islands(client, metrics_token, running,
                                                          draft, redis_url):
    store = RunStore(connect(redis_url), running.pk)
    store.client.set(store.key("status"), json.dumps({
        "versions": [5, 4], "outer_steps": 4, "goodput": 0.75, "uptime": 0.5,
        "alive_islands": 1, "eval_loss": 2.0, "eval_tokens": 6144, "eval_bpb": 2.885,
        "islands": {"east-a": {"state": "lost", "fault": "partition", "version_lag": 3,
                               "tokens": 4096}}}))
    Run.objects.filter(pk=running.pk).update(tokens=8192, outer_steps=4)  # as syncd keeps it

    response = scrape(client, HTTP_AUTHORIZATION=f"Bearer {metrics_token}")

    assert response.status_code == 200
    assert "# TYPE archipelago_run_tokens gauge" in response.content.decode().splitlines()
    found = samples(response)
    r = running.pk
    assert found[sample("archipelago_run_tokens", run=r)] == 8192
    assert found[sample("archipelago_run_goodput", run=r)] == 0.75
    assert found[sample("archipelago_run_uptime", run=r)] == 0.5
    assert found[sample("archipelago_run_outer_steps", run=r)] == 4
    assert found[sample("archipelago_run_alive_islands", run=r)] == 1
    assert found[sample("archipelago_run_eval_loss", run=r)] == 2.0
    assert found[sample("archipelago_run_eval_tokens", run=r)] == 6144
    assert found[sample("archipelago_run_eval_bpb", run=r)] == 2.885
    assert found[sample("archipelago_run_state", run=r, state="running")] == 1
    assert found[sample("archipelago_run_state", run=r, state="paused")] == 0
    assert found[sample("archipelago_run_info", run=r, name="running", mode="decoupled")] == 1
    assert found[sample("archipelago_island_state", run=r, island="east-a", region="us-east",
                        state="lost")] == 1
    assert found[sample("archipelago_island_fault", run=r, island="east-a",
                        fault="partition")] == 1
    assert found[sample("archipelago_island_version_lag", run=r, island="east-a")] == 3
    assert found[sample("archipelago_island_tokens", run=r, island="east-a")] == 4096
    assert found[sample("archipelago_run_tokens", run=draft.pk)] == 0
    assert sample("archipelago_run_goodput", run=draft.pk) not in found
    assert found[sample("archipelago_runs", state="running")] == 1
    assert found[sample("archipelago_redis_up")] == 1


def test_each_island_has_gauges_of_its_backpressure_and_upload_slot_waits(
        client, metrics_token, running, redis_url):
    RunStore(connect(redis_url), running.pk).put_status({"islands": {
        "east-a": {"state": "training", "backpressure_wait_s": 2.5, "slot_wait_s": 0.75}}})

    found = samples(scrape(client, HTTP_AUTHORIZATION=f"Bearer {metrics_token}"))

    r = running.pk
    assert found[sample("archipelago_island_backpressure_wait_seconds", run=r,
                        island="east-a")] == 2.5
    assert found[sample("archipelago_island_slot_wait_seconds", run=r, island="east-a")] == 0.75
    assert found[sample("archipelago_island_slot_wait_seconds", run=r, island="west-a")] == 0.0


def test_archived_runs_are_left_out(operator_client, draft):
    Run.objects.filter(pk=draft.pk).update(archived=True)

    response = scrape(operator_client)

    assert f'run="{draft.pk}"' not in response.content.decode()
    assert samples(response)[sample("archipelago_runs", state="draft")] == 1


def test_label_values_are_escaped(operator_client, draft):
    Run.objects.filter(pk=draft.pk).update(name='a "b"\\c\nd')

    response = scrape(operator_client)

    assert 'name="a \\"b\\"\\\\c\\nd"' in response.content.decode()
    assert samples(response)[sample("archipelago_run_info", run=draft.pk,
                                    name='a "b"\\c\nd', mode=draft.mode)] == 1
