"""Named starting points for a new run (webapp.runs.presets): each a whole valid config,
its islands moved to the regions this deployment has."""

import pytest

from diloco.config import RunConfig
from diloco.config_parse import parse_config
from diloco.presets import PAPER_REGIONS, PRESETS
from diloco.sizes import estimate
from diloco.synchronizer import history_length
from webapp.runs.presets import preset_config


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_is_a_valid_config_with_every_section_and_island_field(name):
    config = preset_config(name, list(PAPER_REGIONS))

    parsed = parse_config(config, list(PAPER_REGIONS))
    assert parsed.to_dict() == config


@pytest.mark.parametrize("name", ["paper", "gpt2_small"])
def test_the_presets_over_wide_area_links_send_int4_and_pull_int8_differences_at_2_gbps(
        name):
    parsed = parse_config(preset_config(name, list(PAPER_REGIONS)), list(PAPER_REGIONS))

    assert (parsed.sync.compression, parsed.sync.downlink_compression) == ("int4", "int8")
    # A lossy downlink keeps differences for islands up to max_staleness versions behind.
    assert history_length(parsed.sync) == parsed.sync.max_staleness > 0
    assert estimate(parsed).redis.parts["downlink differences"] > 0
    assert {island.bandwidth_gbps for island in parsed.islands} == {2.0}
    assert all(island.latency_ms > 0 for island in parsed.islands)


def test_the_gpt2_small_presets_islands_have_the_paper_presets_latency_of_their_region():
    paper = preset_config("paper", list(PAPER_REGIONS))["islands"]
    small = preset_config("gpt2_small", list(PAPER_REGIONS))["islands"]
    latency = {island["region"]: island["latency_ms"] for island in paper}

    assert [(i["region"], i["latency_ms"]) for i in small] == [
        ("us-east", latency["us-east"]), ("us-west", latency["us-west"])]


def test_a_preset_keeps_its_regions_where_the_deployment_has_them():
    config = preset_config("paper", list(PAPER_REGIONS))

    assert [island["region"] for island in config["islands"]] == list(PAPER_REGIONS)
    assert [island["latency_ms"] for island in config["islands"]] == [10, 20, 35, 25]


def test_islands_of_a_missing_region_move_together_to_a_region_the_preset_does_not_use():
    config = preset_config("gpt2_small", ["us-east", "eu-west", "ap-south"])

    assert [island["region"] for island in config["islands"]] == ["us-east", "eu-west"]


def test_with_one_region_every_island_moves_there():
    config = preset_config("paper", ["eu-west"])

    assert {island["region"] for island in config["islands"]} == {"eu-west"}


def test_the_custom_preset_is_the_defaults_on_the_deployments_region():
    defaults = RunConfig().to_dict()

    config = preset_config("custom", ["eu-west"])

    assert {k: v for k, v in config.items() if k != "islands"} == {
        k: v for k, v in defaults.items() if k != "islands"}
    assert config["islands"] == [{**island, "region": "eu-west"}
                                 for island in defaults["islands"]]


def test_an_unknown_preset_or_no_regions_is_refused():
    with pytest.raises(ValueError, match="unknown preset 'huge'; expected one of demo"):
        preset_config("huge", ["us-east"])
    with pytest.raises(ValueError, match="at least one region"):
        preset_config("demo", [])
