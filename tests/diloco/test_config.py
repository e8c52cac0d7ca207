import json

from diloco.config import RunConfig, field_help, mode_problems, synchronous, with_mode_values
from diloco.config_parse import parse_config

REGIONS = ["us-east", "us-west"]


def test_to_dict_survives_a_json_round_trip():
    config = parse_config({"sync": {"compression": "int8"}}, REGIONS)

    assert parse_config(json.loads(json.dumps(config.to_dict())), REGIONS) == config


def test_field_help_covers_every_field_with_a_sentence():
    help_texts = field_help()

    assert help_texts["sync.min_quorum"].startswith("K:")
    assert "islands[].region" in help_texts
    assert "seed" in help_texts
    assert all(text.strip() for text in help_texts.values())
    expected = {f"{section}.{name}" for section, values in RunConfig().to_dict().items()
                if isinstance(values, dict) for name in values}
    assert expected <= set(help_texts)


def test_the_chaos_presets_are_the_ones_syncd_knows():
    from diloco.chaos import PRESETS
    from diloco.config import CHAOS_PRESETS

    assert set(CHAOS_PRESETS) == {"none", *PRESETS}
    assert "chaos.preset" in field_help() and "chaos.seed" in field_help()


def test_islands_train_in_one_fp32_process_on_the_best_device_unless_asked_otherwise():
    config = parse_config({}, REGIONS)

    assert (config.train.device, config.train.precision) == ("auto", "fp32")
    assert all(island.processes == 1 for island in config.islands)
    assert "train.device" in field_help() and "islands[].processes" in field_help()


def test_mode_sync_has_every_island_in_each_merge_and_waits_for_it():
    config = parse_config({"sync": {"min_quorum": 1}}, REGIONS)
    assert dict(mode_problems("decoupled", config)) == {}
    assert set(dict(mode_problems("sync", config))) == {"sync.min_quorum",
                                                        "sync.overlap_steps"}
    made = synchronous(config)
    assert (made.sync.min_quorum, made.sync.overlap_steps) == (len(config.islands), 0)
    assert dict(mode_problems("sync", made)) == {}
    assert "mode sync" in field_help()["sync.overlap_steps"]


def test_mode_sync_fills_in_the_quorum_and_overlap_a_user_left_out_and_keeps_what_they_gave():
    given = {"sync": {"min_quorum": 1}}
    config = parse_config(given, REGIONS)

    filled = with_mode_values("sync", config, given)

    assert (filled.sync.min_quorum, filled.sync.overlap_steps) == (1, 0)
    assert set(dict(mode_problems("sync", filled))) == {"sync.min_quorum"}
    assert with_mode_values("decoupled", config, given) == config
    assert dict(mode_problems("sync", with_mode_values("sync", config, {}))) == {}
