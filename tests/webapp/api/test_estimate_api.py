"""The size estimate of a run config, and the refusal of a run that does not fit the
memory the hosts declare, through the API."""

import pytest

from diloco.config_parse import parse_config
from diloco.island import gpt_config
from diloco.model import GPT
from diloco.sizes import MIB, wire_per_outer_step
from webapp.runs.models import Run

SMALL = {"model": {"n_layer": 2, "n_embd": 32, "n_head": 4, "block_size": 32},
         "islands": [{"name": "east-a", "region": "us-east"},
                     {"name": "west-a", "region": "us-west"}]}


def test_it_estimates_the_parameters_and_memory_of_a_config(viewer_api, settings):
    response = viewer_api.post("/api/config/estimate", {"config": SMALL})

    assert response.status_code == 200, response.json()
    data = response.json()
    model = GPT(gpt_config(parse_config(SMALL, settings.REGIONS)))
    assert data["params"] == model.num_params()
    assert data["model_bytes"] == 4 * model.num_params()
    assert set(data["islands"]) == set(data["expected"]) == {"east-a", "west-a"}
    for need in (data["redis"], data["syncd"], *data["islands"].values(),
                 *data["expected"].values()):
        assert need["total"] == sum(need["parts"].values())
    for name, need in data["expected"].items():
        assert 0 < need["total"] < data["islands"][name]["total"]
    assert data["limits"] == {"redis_bytes": settings.REDIS_MAXMEMORY_MB * MIB,
                              "syncd_host_bytes": settings.SYNCD_HOST_MEMORY_MB * MIB,
                              "island_host_bytes": settings.ISLAND_HOST_MEMORY_MB * MIB}
    assert data["misfits"] == {}


def test_the_estimate_follows_the_codec_and_the_upload_slots_not_the_islands(viewer_api):
    def messages(config):
        return viewer_api.post("/api/config/estimate", {"config": config}).json()[
            "redis"]["parts"]["update messages"]

    three = {**SMALL, "islands": [*SMALL["islands"], {"name": "west-b", "region": "us-west"}]}

    assert messages(three) == messages(SMALL)
    assert messages({**SMALL, "sync": {"upload_slots": 4}}) == 2 * messages(SMALL)
    assert messages({**SMALL, "sync": {"compression": "bf16"}}) == messages(SMALL) // 2


def test_it_gives_each_islands_wire_bytes_per_outer_step_and_its_links_seconds(
        viewer_api, settings):
    islands = [{**SMALL["islands"][0], "bandwidth_gbps": 0.5, "latency_ms": 10},
               {**SMALL["islands"][1], "bandwidth_gbps": 2.0, "latency_ms": 40}]
    config = {**SMALL, "sync": {"compression": "int4", "downlink_compression": "int8"},
              "islands": islands}

    data = viewer_api.post("/api/config/estimate", {"config": config}).json()

    wire = wire_per_outer_step(parse_config(config, settings.REGIONS))
    assert data["wire"] == {name: w.to_dict() for name, w in wire.items()}
    assert set(data["wire"]) == {"east-a", "west-a"}
    east, west = data["wire"]["east-a"], data["wire"]["west-a"]
    assert east["up_bytes"] == west["up_bytes"] < east["down_bytes"] == west["down_bytes"]
    # The default 4 fragments: 4 messages each way, each its latency.
    assert east["up_s"] == pytest.approx(4 * 0.010 + east["up_bytes"] * 8 / 0.5e9)
    assert west["down_s"] == pytest.approx(4 * 0.040 + west["down_bytes"] * 8 / 2e9)


def test_the_wire_follows_the_codecs(viewer_api):
    def wire(sync):
        return viewer_api.post("/api/config/estimate", {"config": {**SMALL, "sync": sync}}
                               ).json()["wire"]["east-a"]

    none, lossy = wire({}), wire({"compression": "int4", "downlink_compression": "int8"})

    assert none["up_bytes"] == none["down_bytes"] == 4 * viewer_api.post(
        "/api/config/estimate", {"config": SMALL}).json()["params"]
    assert lossy["up_bytes"] < lossy["down_bytes"] < none["down_bytes"]


def test_the_estimate_says_what_the_configs_k_grace_alpha_tau_wait_and_merge_rule_cost(
        viewer_api):
    config = {**SMALL, "sync": {"min_quorum": 2, "overlap_steps": 0}}

    tradeoffs = viewer_api.post("/api/config/estimate", {"config": config}).json()["tradeoffs"]

    by_setting = {t["setting"]: t for t in tradeoffs}
    assert list(by_setting) == ["sync.min_quorum", "sync.grace_gamma", "sync.alpha",
                                "sync.overlap_steps", "sync.wait_share",
                                "sync.merge_each_period"]
    assert by_setting["sync.min_quorum"]["value"].startswith("2 of 2 islands: every merge waits")
    assert by_setting["sync.overlap_steps"]["value"] == "0: each island waits for each merge"
    assert "2.05x the tokens" in by_setting["sync.min_quorum"]["speed"]
    assert by_setting["sync.min_quorum"]["source"].startswith(
        "bench/results/convergence-quick.json")


def test_it_answers_422_for_a_bad_config_keyed_by_dotted_path(viewer_api):
    response = viewer_api.post("/api/config/estimate",
                               {"config": {**SMALL, "sync": {"fragments": 22}}})

    assert response.status_code == 422
    assert "sync.fragments" in response.json()["errors"]


def test_the_estimate_says_what_does_not_fit(viewer_api, settings):
    settings.REDIS_MAXMEMORY_MB = 64  # the base alone

    data = viewer_api.post("/api/config/estimate", {"config": SMALL}).json()

    assert list(data["misfits"]) == ["model"]
    assert "Redis would need about" in data["misfits"]["model"][0]


def test_a_run_that_does_not_fit_redis_is_refused_at_create(operator_api, settings,
                                                            redis_url):
    settings.REDIS_MAXMEMORY_MB = 64

    response = operator_api.post("/api/runs", {"name": "big", "mode": "decoupled",
                                               "config": SMALL})

    assert response.status_code == 422
    [message] = response.json()["errors"]["model"]
    assert message.startswith("Redis would need about 6")
    assert "more than REDIS_MAXMEMORY_MB allows (64 MiB)" in message
    assert "global fragments" in message or "base" in message
    assert not Run.objects.exists()


def test_an_island_whose_batch_does_not_fit_is_refused_beside_its_batch_size(
        operator_api, settings, redis_url):
    settings.ISLAND_HOST_MEMORY_MB = 512
    islands = [SMALL["islands"][0], {**SMALL["islands"][1], "batch_size": 4096}]

    response = operator_api.post("/api/runs", {"name": "wide", "mode": "decoupled",
                                               "config": {**SMALL, "islands": islands}})

    assert response.status_code == 422
    errors = response.json()["errors"]
    assert list(errors) == ["islands.1.batch_size"]
    [message] = errors["islands.1.batch_size"]
    assert message.startswith("Island 'west-a' would need about ")
    assert "activations (an estimate) at batch_size 4096" in message
    assert message.endswith("ISLAND_HOST_MEMORY_MB allows (512 MiB): a smaller batch_size "
                            "would fit.")


def test_a_model_too_large_for_an_island_host_is_refused_once_under_model(
        operator_api, settings, redis_url):
    settings.ISLAND_HOST_MEMORY_MB = 1
    settings.REDIS_MAXMEMORY_MB = 1024

    response = operator_api.post("/api/runs", {"name": "big", "mode": "decoupled",
                                               "config": SMALL})

    assert response.status_code == 422
    [message] = response.json()["errors"]["model"]
    assert message.startswith("Island 'east-a' would need about ")
    assert "of it without activations (" in message
    assert message.endswith("ISLAND_HOST_MEMORY_MB allows (1 MiB): a smaller model would fit.")


@pytest.mark.parametrize("limit", ["REDIS_MAXMEMORY_MB", "SYNCD_HOST_MEMORY_MB",
                                   "ISLAND_HOST_MEMORY_MB"])
def test_a_draft_that_no_longer_fits_is_refused_at_start(operator_api, settings, draft,
                                                         enqueued, limit):
    setattr(settings, limit, 1)

    response = operator_api.post(f"/api/runs/{draft.pk}/start")

    assert response.status_code == 422
    assert "model" in response.json()["errors"]
    draft.refresh_from_db()
    assert draft.state == Run.State.DRAFT
    assert enqueued == []
