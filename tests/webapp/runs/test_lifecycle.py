import logging

import pytest
from django.db import transaction

from diloco.config_parse import ConfigError, parse_config
from syncd.connection import connect
from webapp.runs.lifecycle import create_run, default_config, delete_run, start_run
from webapp.runs.models import Checkpoint, Island, Run

pytestmark = pytest.mark.django_db

TWO_ISLANDS = {
    "sync": {"min_quorum": 1},
    "islands": [
        {"name": "east", "region": "us-east", "speed": 2.0, "batch_size": 16},
        {"name": "west", "region": "us-west", "bandwidth_gbps": 0.5, "latency_ms": 80.0},
    ],
}


def test_it_creates_a_draft_run_with_one_island_per_configured_island(operator):
    run = create_run(name="two coasts", mode="decoupled", config=TWO_ISLANDS, user=operator)

    run.refresh_from_db()
    assert (run.name, run.mode, run.state, run.created_by) == (
        "two coasts", "decoupled", "draft", operator)
    islands = list(run.islands.all())
    assert [(i.name, i.region) for i in islands] == [("east", "us-east"), ("west", "us-west")]
    assert (islands[0].speed, islands[0].batch_size) == (2.0, 16)
    assert (islands[1].bandwidth_gbps, islands[1].latency_ms) == (0.5, 80.0)
    assert all(i.state == Island.State.PENDING for i in islands)


def test_it_stores_the_whole_config_with_defaults_filled_in():
    run = create_run(name="r", mode="elastic", config=TWO_ISLANDS, user=None)

    assert run.config["sync"]["min_quorum"] == 1
    assert run.config["sync"]["inner_steps"] == 50
    assert run.run_config() == parse_config(TWO_ISLANDS, ["us-east", "us-west"])


def test_it_strips_the_name():
    run = create_run(name="  spaced  ", mode="decoupled", config={}, user=None)

    assert run.name == "spaced"


@pytest.mark.parametrize("name", ["", "   ", None, 7])
def test_it_requires_a_name(name):
    with pytest.raises(ConfigError) as e:
        create_run(name=name, mode="decoupled", config={}, user=None)

    assert e.value.errors == {"name": ["This field is required."]}


def test_it_rejects_a_name_over_100_characters():
    with pytest.raises(ConfigError) as e:
        create_run(name="x" * 101, mode="decoupled", config={}, user=None)

    assert e.value.errors == {"name": ["Must be at most 100 characters, got 101."]}


def test_it_rejects_an_unknown_mode():
    with pytest.raises(ConfigError) as e:
        create_run(name="r", mode="synchronous", config={}, user=None)

    assert e.value.errors == {
        "mode": ["Must be one of decoupled, sync, elastic, got 'synchronous'."]}


def test_a_sync_run_needs_every_island_in_each_merge_and_no_overlap_by_field():
    config = {"sync": {"min_quorum": 1, "overlap_steps": 2}, "islands": TWO_ISLANDS["islands"]}

    with pytest.raises(ConfigError) as e:
        create_run(name="r", mode="sync", config=config, user=None)

    assert e.value.errors == {
        "sync.min_quorum": ["Must be the number of islands in mode sync (every island in "
                            "each merge): 2, got 1."],
        "sync.overlap_steps": ["Must be 0 in mode sync (each island waits for the merge of "
                               "its update), got 2."]}
    run = create_run(name="r", mode="sync", user=None, config={
        **config, "sync": {"min_quorum": 2, "overlap_steps": 0}})
    assert run.mode == Run.Mode.SYNC


def test_it_reports_every_problem_at_once_and_saves_nothing():
    config = {"sync": {"min_quorum": 3}, "model": {"n_head": 5}}

    with pytest.raises(ConfigError) as e:
        create_run(name="", mode="nope", config=config, user=None)

    assert set(e.value.errors) == {"name", "mode", "sync.min_quorum", "model.n_head"}
    assert not Run.objects.exists()
    assert not Island.objects.exists()


def test_it_keeps_config_keys_named_like_run_fields_apart_from_them():
    with pytest.raises(ConfigError) as e:
        create_run(name="r", mode="decoupled", config={"name": "oops"}, user=None)

    assert e.value.errors == {"config.name": ["Unknown field."]}


def test_it_rejects_a_region_this_deployment_does_not_have(settings):
    settings.REGIONS = ["eu-west"]

    with pytest.raises(ConfigError) as e:
        create_run(name="r", mode="decoupled", config={}, user=None)

    assert "islands.0.region" in e.value.errors
    assert "eu-west" in e.value.errors["islands.0.region"][0]


def test_the_default_config_fits_the_deployments_regions(settings):
    settings.REGIONS = ["eu-west", "eu-north"]

    config = default_config()

    assert {island["region"] for island in config["islands"]} == {"eu-west"}
    run = create_run(name="r", mode="decoupled", config=config, user=None)
    assert run.islands.count() == len(config["islands"])


def ended_run(tmp_path):
    run = Run.objects.create(name="ended", mode="decoupled", config={},
                             state=Run.State.COMPLETED)
    path = tmp_path / "ended.safetensors"
    path.write_bytes(b"weights")
    Checkpoint.objects.create(run=run, outer_step=1, path=str(path), sha256="0" * 64, bytes=7)
    return run, path


def test_a_runs_redis_keys_go_only_once_its_deletion_is_committed(
        redis_url, tmp_path, django_capture_on_commit_callbacks):
    run, path = ended_run(tmp_path)
    run_id, client = run.pk, connect(redis_url)
    client.set(f"arch:{run_id}:status", "{}")

    with django_capture_on_commit_callbacks(execute=True), transaction.atomic():
        delete_run(run, None)
        assert not Run.objects.filter(pk=run_id).exists()
        assert client.ttl(f"arch:{run_id}:status") == -1 and path.exists()

    assert 0 < client.ttl(f"arch:{run_id}:status") <= 60  # a deleted run keeps nothing
    assert not path.exists()


def test_a_run_is_deleted_when_redis_cannot_be_reached_and_the_log_says_what_is_left(
        settings, tmp_path, caplog, django_capture_on_commit_callbacks):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there
    run, path = ended_run(tmp_path)
    run_id = run.pk

    with caplog.at_level(logging.ERROR, "archipelago.web"), \
            django_capture_on_commit_callbacks(execute=True):
        delete_run(run, None)

    assert not Run.objects.filter(pk=run_id).exists() and not path.exists()
    [record] = caplog.records
    assert record.getMessage().startswith(
        f"run {run_id} is deleted but its Redis keys (arch:{run_id}:*) are left: ")


# About 122 MiB of Redis each, 64 MiB of it the base that runs share: two fit 200 MiB
# and three do not.
SIZED = {"model": {"n_layer": 4, "n_embd": 256, "n_head": 4, "block_size": 256},
         "sync": {"min_quorum": 1},
         "islands": [{"name": "east", "region": "us-east", "batch_size": 1}]}


@pytest.fixture
def admitted(settings):
    """Two runs of SIZED that hold their memory (running, stopping) and two that do not
    (a draft, a stopped run); Redis declared at 120 MiB: one run of SIZED takes 87 MiB
    (64 of it the base, which runs share), each other admitted run 23 MiB more, with
    the published fragments on the data plane (SYNCD_SERVE off)."""
    settings.REDIS_MAXMEMORY_MB = 120
    settings.SYNCD_SERVE = "off"
    config = parse_config(SIZED, settings.REGIONS).to_dict()
    return [Run.objects.create(name=state, mode="decoupled", config=config, state=state)
            for state in ("running", "stopping", "draft", "stopped")]


def test_a_run_is_refused_at_create_when_redis_cannot_hold_it_beside_the_admitted_runs(
        admitted):
    with pytest.raises(ConfigError) as refused:
        create_run(name="third", mode="decoupled", config=SIZED, user=None)

    [message] = refused.value.errors["model"]
    assert "and the 2 other admitted runs take 45 MiB already, more than " \
           "REDIS_MAXMEMORY_MB allows (120 MiB)" in message
    assert not Run.objects.filter(name="third").exists()


def test_a_draft_is_refused_at_start_when_the_admitted_runs_took_the_memory_meanwhile(
        admitted, enqueued):
    Run.objects.filter(name="stopping").update(state=Run.State.STOPPED)
    draft = create_run(name="third", mode="decoupled", config=SIZED, user=None)
    Run.objects.filter(name="stopped").update(state=Run.State.PAUSED)

    with pytest.raises(ConfigError) as refused:
        start_run(draft, None)

    assert "the 2 other admitted runs take 45 MiB already" in refused.value.errors["model"][0]
    draft.refresh_from_db()
    assert draft.state == Run.State.DRAFT and enqueued == []
