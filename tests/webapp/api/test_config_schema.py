"""The run config's schema (webapp/api/config_schema.py), as the OpenAPI schema states it.

A run config's schema states every field of diloco/config.py: its type, bounds,
choices, default and help, at every place a config or an island is sent.
"""

import dataclasses
import re
import sys

import pytest

from diloco.config import (
    MAX_ISLAND_NAME,
    MAX_ISLANDS,
    MAX_TEXT,
    SECTIONS,
    IslandConfig,
    RunConfig,
    default_islands,
)
from webapp.api.api import api
from webapp.api.config_schema import NOT_BLANK, WHITESPACE


@pytest.fixture
def openapi(settings):
    settings.REGIONS = ["us-east", "mars-north"]
    return api.get_openapi_schema()


def component(openapi, ref_or_schema: dict) -> dict:
    """The component a property points to, through allOf/anyOf with null."""
    for key in ("allOf", "anyOf"):
        if key in ref_or_schema:
            [ref_or_schema] = [s for s in ref_or_schema[key] if s != {"type": "null"}]
    name = ref_or_schema["$ref"].rsplit("/", 1)[1]
    return openapi["components"]["schemas"][name]


def body_of(openapi, path: str) -> dict:
    content = openapi["paths"][path]["post"]["requestBody"]["content"]
    return component(openapi, content["application/json"]["schema"])


def expected(f: dataclasses.Field) -> dict:
    """The JSON schema of a config field, read from its spec(...) as parse_config reads it."""
    meta = f.metadata
    kind = type(f.default) if f.default is not None else float
    if meta["choices"]:
        value = {"type": "string", "enum": list(meta["choices"])}
    elif kind is bool:
        value = {"type": "boolean"}
    elif kind is str:
        value = {"type": "string", "maxLength": MAX_TEXT, "pattern": "^[^\\x00]*$"}
    else:
        value = {"type": "integer" if kind is int else "number",
                 "minimum": meta["lo"], "maximum": meta["hi"]}
    return {"anyOf": [value, {"type": "null"}]} if meta["optional"] else value


def check_fields(schema: dict, cls: type, skip: tuple[str, ...] = ()) -> None:
    assert schema["additionalProperties"] is False
    assert set(schema["properties"]) == {f.name for f in dataclasses.fields(cls)}
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        prop = schema["properties"][f.name]
        stated = {key: value for key, value in prop.items()
                  if key not in ("title", "description", "default")}
        assert stated == expected(f), f"{cls.__name__}.{f.name}"
        # (ninja leaves out a default of null)
        assert prop.get("default") == f.default, f"{cls.__name__}.{f.name}"
        assert prop["description"].startswith(f.metadata["help"]), f"{cls.__name__}.{f.name}"



def test_every_config_field_states_its_type_bounds_choices_default_and_help(openapi):
    config = component(openapi, body_of(openapi, "/api/runs")["properties"]["config"])

    seed = next(f for f in dataclasses.fields(RunConfig) if f.name == "seed")
    assert {k: v for k, v in config["properties"]["seed"].items()
            if k in ("type", "minimum", "maximum", "default")} == {**expected(seed), "default": 0}
    assert set(config["properties"]) == {f.name for f in dataclasses.fields(RunConfig)}
    for section, cls in SECTIONS.items():
        prop = config["properties"][section]
        assert {"type": "null"} in prop["anyOf"]
        assert prop["default"] == dataclasses.asdict(cls())
        check_fields(component(openapi, prop), cls)


def test_the_islands_of_a_config_and_an_added_island_are_one_schema(openapi):
    config = component(openapi, body_of(openapi, "/api/runs")["properties"]["config"])
    islands = next(s for s in config["properties"]["islands"]["anyOf"] if s != {"type": "null"})
    item = component(openapi, islands["items"])

    assert (islands["minItems"], islands["maxItems"]) == (1, MAX_ISLANDS)
    assert config["properties"]["islands"]["default"] == [
        dataclasses.asdict(i) for i in default_islands()]
    assert item == body_of(openapi, "/api/runs/{run_id}/islands")
    check_fields(item, IslandConfig, skip=("name", "region"))
    assert set(item["required"]) == {"name", "region"}
    name = item["properties"]["name"]
    assert (name["minLength"], name["maxLength"], name["pattern"]) == (1, MAX_ISLAND_NAME,
                                                                       NOT_BLANK)


def test_an_islands_region_is_one_of_the_deployments_regions(openapi):
    island = body_of(openapi, "/api/runs/{run_id}/islands")

    assert island["properties"]["region"]["enum"] == ["us-east", "mars-north"]


def test_the_config_names_the_rules_between_fields(openapi):
    config = component(openapi, body_of(openapi, "/api/runs")["properties"]["config"])
    sync = component(openapi, config["properties"]["sync"])

    assert "rules between fields" in config["description"]
    assert sync["properties"]["min_quorum"]["description"].endswith(
        "At most the number of islands. The number of islands in mode sync.")


def test_a_name_is_blank_in_the_schema_exactly_when_strip_leaves_nothing():
    spaces = "".join(chr(c) for c in range(sys.maxunicode + 1) if chr(c).isspace())

    assert all((re.fullmatch(f"[{WHITESPACE}]", c) is not None) == c.isspace()
               for c in map(chr, range(sys.maxunicode + 1)))
    assert re.search(NOT_BLANK, spaces) is None
    assert re.search(NOT_BLANK, spaces + "a") is not None


def test_the_estimate_takes_the_same_config(openapi):
    run = body_of(openapi, "/api/runs")["properties"]["config"]
    estimate = body_of(openapi, "/api/config/estimate")["properties"]["config"]

    assert component(openapi, run) == component(openapi, estimate)
