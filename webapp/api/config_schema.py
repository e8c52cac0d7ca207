"""The run config's schema, compiled from the dataclasses of diloco/config.py: each
field's type, bounds, choices, default and help, so that the API's schema and
parse_config's validation read the same facts.

The values are taken as sent and checked by parse_config, which tells every problem
at once, keyed by dotted path; the schema only describes them. webapp/api/schemas.py
makes the run config's and an island's request bodies with these functions.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, Literal

from django.conf import settings
from ninja import Field, Schema
from pydantic import PlainValidator, create_model

from diloco.config import (
    MAX_ISLAND_NAME,
    MAX_ISLANDS,
    MAX_TEXT,
    SECTIONS,
    IslandConfig,
    RunConfig,
    default_islands,
    rule_summaries,
)

# The body parser refuses a NUL anywhere (400). A name must not be blank: hold a
# character that str.strip keeps (spelled out, since a schema's \s is ECMAScript's).
NO_NUL = r"^[^\x00]*$"
WHITESPACE = r"\t\n\v\f\r\x1c-\x1f \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
NOT_BLANK = rf"^[^\x00]*[^\x00{WHITESPACE}][^\x00]*$"
# Rules between fields, which parse_config checks and no field's bounds can say
# (diloco.config.RULES): stated in the descriptions of the fields they constrain.
RELATIONS = rule_summaries()
CONFIG_RULES = (
    "Each field's type, bounds and choices are stated here, from diloco/config.py. "
    "parse_config checks them, and with them the rules between fields that this schema "
    "names only in descriptions: "
    + " ".join(f"{name}: {summary}" for name, summary in RELATIONS.items())
    + " Islands' names are unique; Redis and every island host fit in the memory their "
    "hosts declare (REDIS_MAXMEMORY_MB, ISLAND_HOST_MEMORY_MB); data.path lies inside "
    "DATA_ROOTS. Every problem comes back at once, keyed by dotted path (sync.min_quorum, "
    "islands.2.region).")


def _as_sent(value: Any) -> Any:
    return value


def _described(kind: Any) -> Any:
    """A value the schema describes as `kind` and the API takes as sent: parse_config
    checks it beside the rest of the config, with messages keyed by dotted path."""
    return Annotated[Any, PlainValidator(_as_sent, json_schema_input_type=kind)]


def _json_type(f: dataclasses.Field) -> Any:
    """The JSON a config field takes, as diloco.config checks it: its choices, or its
    type (from its default, as parse_config reads it) with its bounds."""
    meta = f.metadata
    kind = type(f.default) if f.default is not None else float
    if meta["choices"]:
        value: Any = Literal[meta["choices"]]
    elif kind is bool:
        value = bool
    elif kind is str:
        value = Annotated[str, Field(max_length=MAX_TEXT, pattern=NO_NUL)]
    else:
        value = Annotated[kind, Field(ge=meta["lo"], le=meta["hi"])]
    return value | None if meta["optional"] else value


def _config_field(section: str, f: dataclasses.Field) -> tuple[Any, Any]:
    help = " ".join(filter(None, (f.metadata["help"], RELATIONS.get(f"{section}.{f.name}"))))
    return _described(_json_type(f)), Field(f.default, description=help)


def _regions(schema: dict[str, Any]) -> None:
    # Read when the schema is made, not at import: the regions are the deployment's.
    schema["enum"] = list(settings.REGIONS)


def _section_in(section: str, cls: type, base: type[Schema]) -> type[Schema]:
    fields = {f.name: _config_field(section, f) for f in dataclasses.fields(cls)}
    return create_model(f"{cls.__name__}In", __base__=base, **fields)


def island_in(base: type[Schema]) -> type[Schema]:
    """An island of the run config (diloco.config.IslandConfig), on `base`. As the body
    of POST .../islands it is the island's own fields, checked by parse_config with the
    run's."""
    fields = {f.name: _config_field("islands", f) for f in dataclasses.fields(IslandConfig)}
    fields["name"] = (_described(Annotated[str, Field(min_length=1, max_length=MAX_ISLAND_NAME,
                                                      pattern=NOT_BLANK)]),
                      Field(description=f"Unique within the run; 1 to {MAX_ISLAND_NAME} "
                                        "characters, not blank."))
    fields["region"] = (_described(str),
                        Field(description="A region that has a worker (GET "
                                          "/api/config/schema: regions).",
                              json_schema_extra=_regions))
    return create_model("IslandIn", __base__=base, **fields)


def run_config_in(base: type[Schema], island: type[Schema]) -> type[Schema]:
    """The run config (diloco.config.RunConfig), on `base`, with `island` for each of its
    islands: every field may be left out."""
    seed = next(f for f in dataclasses.fields(RunConfig) if f.name == "seed")
    fields: dict[str, Any] = {"seed": _config_field("", seed)}
    for section, cls in SECTIONS.items():
        fields[section] = (_section_in(section, cls, base) | None, Field(
            dataclasses.asdict(cls()),
            description="Missing or null: every field takes its default."))
    fields["islands"] = (
        Annotated[list[island], Field(min_length=1, max_length=MAX_ISLANDS)] | None,
        Field([dataclasses.asdict(i) for i in default_islands()],
              description="Missing or null: these two islands."))
    return create_model("RunConfigIn", __base__=base, __doc__=CONFIG_RULES, **fields)
