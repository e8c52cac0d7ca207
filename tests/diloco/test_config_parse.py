import math

import pytest

from diloco.config import RunConfig
from diloco.config_parse import ConfigError, parse_config

REGIONS = ["us-east", "us-west"]


def errors_of(data, regions=REGIONS) -> dict[str, list[str]]:
    with pytest.raises(ConfigError) as e:
        parse_config(data, regions)
    return e.value.errors


def test_the_defaults_parse_to_the_default_config():
    assert parse_config({}, REGIONS) == RunConfig()
    assert parse_config(RunConfig().to_dict(), REGIONS) == RunConfig()


def test_a_partial_config_keeps_the_other_defaults():
    config = parse_config({"sync": {"inner_steps": 20}}, REGIONS)

    assert config.sync.inner_steps == 20
    assert config.sync.fragments == RunConfig().sync.fragments
    assert config.model == RunConfig().model


def test_it_rejects_a_config_that_is_not_an_object():
    assert errors_of([]) == {"config": ["Must be an object."]}


@pytest.mark.parametrize(("data", "path"), [
    ({"colour": "blue"}, "colour"),
    ({"sync": {"quorum": 2}}, "sync.quorum"),
    ({"islands": [{"name": "a", "region": "us-east", "gpu": "h100"}]}, "islands.0.gpu"),
])
def test_it_rejects_an_unknown_field_by_its_dotted_path(data, path):
    assert errors_of(data)[path] == ["Unknown field."]


def test_it_rejects_a_section_that_is_not_an_object():
    assert errors_of({"sync": 3})["sync"] == ["Must be an object."]


@pytest.mark.parametrize(("section", "name", "value", "message"), [
    ("model", "n_layer", 0, "Must be between 1 and 48, got 0."),
    ("model", "n_layer", 49, "Must be between 1 and 48, got 49."),
    ("sync", "alpha", 1.5, "Must be between 0 and 1, got 1.5."),
    ("optim", "inner_lr", 0.0, "Must be between 1e-06 and 1, got 0."),
])
def test_it_rejects_values_out_of_bounds_and_states_the_bounds(section, name, value, message):
    assert errors_of({section: {name: value}}) == {f"{section}.{name}": [message]}


def test_it_accepts_values_on_the_bounds():
    config = parse_config({"model": {"n_layer": 48}, "sync": {"alpha": 0.0}}, REGIONS)

    assert (config.model.n_layer, config.sync.alpha) == (48, 0.0)


def test_it_rejects_n_head_that_does_not_divide_n_embd():
    errors = errors_of({"model": {"n_embd": 64, "n_head": 6}})

    assert errors == {"model.n_head": ["Must divide model.n_embd (64), got 6."]}


def test_it_rejects_more_fragments_than_the_model_has_tensors():
    errors = errors_of({"model": {"n_layer": 1}, "sync": {"fragments": 14}})

    assert errors == {"sync.fragments": [
        "Must be at most the number of the model's tensors (8 x model.n_layer + 5 = 13), "
        "got 14."]}


def test_it_rejects_min_quorum_above_island_count_and_names_the_count():
    islands = [{"name": f"island-{i}", "region": "us-east"} for i in range(3)]

    errors = errors_of({"islands": islands, "sync": {"min_quorum": 4}})

    assert errors == {"sync.min_quorum": [
        "Must be between 1 and the number of islands (3), got 4."]}


def test_it_accepts_min_quorum_equal_to_the_island_count():
    islands = [{"name": f"island-{i}", "region": "us-east"} for i in range(3)]

    config = parse_config({"islands": islands, "sync": {"min_quorum": 3}}, REGIONS)

    assert config.sync.min_quorum == 3


def test_it_rejects_two_islands_of_the_same_name():
    islands = [{"name": "twin", "region": "us-east"}, {"name": "twin", "region": "us-west"}]

    errors = errors_of({"islands": islands})

    assert errors == {"islands.1.name": ["Island names must be unique; 'twin' is used twice."]}


def test_it_rejects_an_island_without_a_name():
    errors = errors_of({"islands": [{"region": "us-east"}], "sync": {"min_quorum": 1}})

    assert errors == {"islands.0.name": ["This field is required."]}


@pytest.mark.parametrize("islands", [[], "island-0"])
def test_it_requires_a_list_of_at_least_one_island(islands):
    assert errors_of({"islands": islands})["islands"] == [
        "Must be a list of at least one island."]


def test_it_rejects_a_region_without_workers_and_lists_the_regions():
    islands = [{"name": "a", "region": "mars"}, {"name": "b", "region": "us-east"}]

    errors = errors_of({"islands": islands})

    assert errors == {"islands.0.region": [
        "Must be one of the regions with workers (us-east, us-west), got 'mars'."]}


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_it_rejects_non_finite_numbers(value):
    assert errors_of({"sync": {"alpha": value}}) == {"sync.alpha": ["Must be a finite number."]}


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_it_rejects_non_finite_numbers_for_whole_number_fields(value):
    [message] = errors_of({"sync": {"inner_steps": value}})["sync.inner_steps"]

    assert message.startswith("Must be a whole number")


def test_it_rejects_a_fraction_for_a_whole_number_field_and_accepts_a_whole_float():
    assert errors_of({"model": {"n_layer": 2.5}}) == {
        "model.n_layer": ["Must be a whole number, got 2.5."]}
    assert parse_config({"model": {"n_layer": 3.0}}, REGIONS).model.n_layer == 3


@pytest.mark.parametrize(("data", "path", "message"), [
    ({"sync": {"rda": 1}}, "sync.rda", "Must be true or false, got 1."),
    ({"sync": {"rda": "true"}}, "sync.rda", "Must be true or false, got 'true'."),
    ({"sync": {"inner_steps": True}}, "sync.inner_steps", "Must be a number, got True."),
    ({"sync": {"alpha": "0.5"}}, "sync.alpha", "Must be a number, got '0.5'."),
    ({"data": {"path": 3}}, "data.path", "Must be a string, got 3."),
])
def test_it_rejects_values_of_the_wrong_type(data, path, message):
    assert errors_of(data) == {path: [message]}


def test_it_rejects_a_string_outside_its_choices():
    errors = errors_of({"sync": {"compression": "zip"}})

    assert errors == {"sync.compression": [
        "Must be one of none, bf16, int8, int4, got 'zip'."]}


def test_it_lets_an_optional_field_be_empty_and_requires_the_others():
    config = parse_config({"elastic": {"restart_delay_s": None}}, REGIONS)

    assert config.elastic.restart_delay_s is None
    assert errors_of({"sync": {"alpha": None}}) == {"sync.alpha": ["This field is required."]}


def test_it_reports_every_problem_at_once():
    errors = errors_of({"seed": -1, "sync": {"alpha": 2.0, "compression": "zip"}})

    assert set(errors) == {"seed", "sync.alpha", "sync.compression"}
    assert "seed: " in str(ConfigError(errors))


def test_a_run_has_no_chaos_schedule_unless_one_is_asked_for():
    assert parse_config({}, ["us-east"]).chaos.preset == "none"
    config = parse_config({"chaos": {"preset": "aggressive", "seed": 7}}, ["us-east"])
    assert (config.chaos.preset, config.chaos.seed) == ("aggressive", 7)
    assert config.to_dict()["chaos"] == {"preset": "aggressive", "seed": 7}


@pytest.mark.parametrize("chaos, path, message", [
    ({"preset": "apocalypse"}, "chaos.preset", "Must be one of none, aggressive"),
    ({"seed": -1}, "chaos.seed", "Must be between 0"),
    ({"seed": 1.5}, "chaos.seed", "Must be a whole number"),
    ({"mtbf_s": 5}, "chaos.mtbf_s", "Unknown field."),
    ("aggressive", "chaos", "Must be an object."),
])
def test_it_rejects_a_bad_chaos_schedule_by_its_dotted_path(chaos, path, message):
    with pytest.raises(ConfigError) as e:
        parse_config({"chaos": chaos}, ["us-east"])
    assert any(message in m for m in e.value.errors[path]), e.value.errors


def test_it_accepts_a_gpu_island_of_several_processes_in_bf16():
    config = parse_config({"train": {"device": "cuda", "precision": "bf16"},
                           "islands": [{"name": "a", "region": "us-east", "batch_size": 8,
                                        "processes": 4}],
                           "sync": {"min_quorum": 1}}, REGIONS)

    assert (config.train.device, config.train.precision) == ("cuda", "bf16")
    assert config.islands[0].processes == 4


@pytest.mark.parametrize(("data", "path", "message"), [
    ({"train": {"device": "tpu"}}, "train.device", "Must be one of auto, cpu, cuda, got 'tpu'."),
    ({"train": {"precision": "fp16"}}, "train.precision",
     "Must be one of fp32, bf16, got 'fp16'."),
    ({"islands": [{"name": "a", "region": "us-east", "processes": 0}],
      "sync": {"min_quorum": 1}}, "islands.0.processes", "Must be between 1 and 64, got 0."),
    ({"islands": [{"name": "a", "region": "us-east", "batch_size": 8, "processes": 3}],
      "sync": {"min_quorum": 1}}, "islands.0.processes",
     "Must divide islands.0.batch_size (8), got 3."),
])
def test_it_rejects_a_bad_device_precision_or_process_count(data, path, message):
    assert errors_of(data) == {path: [message]}


def test_a_run_emulates_its_links_in_the_island_process_unless_told_none():
    assert parse_config({}, REGIONS).emulation.link == "process"
    assert parse_config({"emulation": {"link": "none"}}, REGIONS).emulation.link == "none"


@pytest.mark.parametrize(("emulation", "path", "message"), [
    ({"link": "kernel"}, "emulation.link", "Must be one of process, none, got 'kernel'."),
    ({"link": "none", "bytes_scale": 10.0}, "emulation.bytes_scale",
     "Must be 1 with emulation.link none (no emulated link to scale), got 10.0."),
])
def test_it_rejects_an_unknown_link_or_a_scale_of_no_emulated_link(emulation, path, message):
    assert errors_of({"emulation": emulation}) == {path: [message]}
