"""The run config's parser: untrusted JSON into a diloco.config.RunConfig.

`parse_config` reads the schema (each field's type, bounds and choices) and its
rules between fields (diloco.config.RULES) and raises ConfigError with every problem
at once, keyed by dotted path ("sync.min_quorum", "islands.2.region"), which the API
returns as-is with status 422 and the form shows beside the field it names.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, asdict, fields
from typing import Any

from diloco.config import (
    MAX_ISLAND_NAME,
    MAX_ISLANDS,
    MAX_TEXT,
    RULES,
    SECTIONS,
    IslandConfig,
    RunConfig,
    default_islands,
)


class ConfigError(ValueError):
    """Raised with every problem of a config, keyed by dotted path."""

    def __init__(self, errors: dict[str, list[str]]):
        self.errors = errors
        super().__init__("; ".join(f"{k}: {' '.join(v)}" for k, v in sorted(errors.items())))


def _check_value(path: str, f: Any, value: Any, errors: dict[str, list[str]]) -> Any:
    """Coerce one JSON value to the field's type, or record why it cannot be."""
    meta = f.metadata
    default = f.default
    if value is None:
        if meta.get("optional"):
            return None
        errors.setdefault(path, []).append("This field is required.")
        return default
    kind = type(default) if default is not None else float
    if kind is bool:
        if not isinstance(value, bool):
            errors.setdefault(path, []).append(f"Must be true or false, got {value!r}.")
            return default
        return value
    if kind is str:
        if not isinstance(value, str):
            errors.setdefault(path, []).append(f"Must be a string, got {value!r}.")
            return default
        if len(value) > MAX_TEXT:
            errors.setdefault(path, []).append(f"Must be at most {MAX_TEXT} characters.")
            return default
        if "\x00" in value:
            errors.setdefault(path, []).append("Must not contain NUL characters.")
            return default
        if meta.get("choices") and value not in meta["choices"]:
            choices = ", ".join(meta["choices"])
            errors.setdefault(path, []).append(f"Must be one of {choices}, got {value!r}.")
            return default
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        errors.setdefault(path, []).append(f"Must be a number, got {value!r}.")
        return default
    if kind is int:
        if isinstance(value, float) and not value.is_integer():
            errors.setdefault(path, []).append(f"Must be a whole number, got {value!r}.")
            return default
        value = int(value)
    else:
        try:
            value = float(value)
        except OverflowError:  # a whole number too large for a float
            value = math.inf
        if not math.isfinite(value):
            errors.setdefault(path, []).append("Must be a finite number.")
            return default
    lo, hi = meta.get("lo"), meta.get("hi")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        errors.setdefault(path, []).append(
            f"Must be between {lo:g} and {hi:g}, got {_shown(value)}.")
        return default
    return value


def _shown(value: int | float) -> str:
    """A number for a message; a whole number too large for a float is shortened."""
    if isinstance(value, int) and abs(value) >= 10**16:
        digits = str(abs(value))
        return f"{'-' if value < 0 else ''}{digits[0]}.{digits[1:4]}e+{len(digits) - 1}"
    return f"{value:g}"


def _parse_section(prefix: str, cls: type, data: Any, errors: dict[str, list[str]]) -> Any:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        errors.setdefault(prefix, []).append("Must be an object.")
        data = {}
    known = {f.name: f for f in fields(cls)}
    for key in data:
        if key not in known:
            errors.setdefault(f"{prefix}.{key}", []).append("Unknown field.")
    values = {}
    for name, f in known.items():
        if name in data:
            values[name] = _check_value(f"{prefix}.{name}", f, data[name], errors)
        elif f.default is MISSING:
            values[name] = f.default_factory()
    return cls(**values)


def parse_config(data: Any, regions: list[str] | tuple[str, ...]) -> RunConfig:
    """Validate untrusted JSON into a RunConfig; missing fields take their defaults.

    Args:
        data: the config as decoded JSON (a dict), possibly partial.
        regions: the regions that have workers; every island must be in one.

    Raises:
        ConfigError: with every problem found, keyed by dotted path.
    """
    errors: dict[str, list[str]] = {}
    if not isinstance(data, dict):
        raise ConfigError({"config": ["Must be an object."]})
    top = {f.name: f for f in fields(RunConfig)}
    for key in data:
        if key not in top:
            errors.setdefault(key, []).append("Unknown field.")
    seed = _check_value("seed", top["seed"], data.get("seed", 0), errors)
    sections = {name: _parse_section(name, cls, data.get(name), errors)
                for name, cls in SECTIONS.items()}
    islands = _parse_islands(data.get("islands"), regions, errors)
    config = RunConfig(seed=seed, islands=islands, **sections)
    for rule in RULES:
        for path, problem in rule.problems(config):
            errors.setdefault(path, []).append(problem)
    if errors:
        raise ConfigError(errors)
    return config


def _parse_islands(data: Any, regions: list[str] | tuple[str, ...],
                   errors: dict[str, list[str]]) -> list[IslandConfig]:
    if data is None:
        data = [asdict(i) for i in default_islands()]
    if not isinstance(data, list) or not data:
        errors.setdefault("islands", []).append("Must be a list of at least one island.")
        return default_islands()
    if len(data) > MAX_ISLANDS:
        errors.setdefault("islands", []).append(f"At most {MAX_ISLANDS} islands, got {len(data)}.")
        return default_islands()
    islands = [_parse_section(f"islands.{i}", IslandConfig, item, errors)
               for i, item in enumerate(data)]
    seen: set[str] = set()
    for i, island in enumerate(islands):
        if not island.name.strip():
            errors.setdefault(f"islands.{i}.name", []).append("This field is required.")
        elif len(island.name) > MAX_ISLAND_NAME:
            errors.setdefault(f"islands.{i}.name", []).append(
                f"Must be at most {MAX_ISLAND_NAME} characters.")
        elif island.name in seen:
            errors.setdefault(f"islands.{i}.name", []).append(
                f"Island names must be unique; {island.name!r} is used twice.")
        seen.add(island.name)
        if island.region not in regions:
            errors.setdefault(f"islands.{i}.region", []).append(
                f"Must be one of the regions with workers ({', '.join(regions)}), "
                f"got {island.region!r}.")
    return islands


def config_from_spec(spec: dict[str, Any]) -> RunConfig:
    """The run config of a run spec (the web app stores it with the run, and islands and
    syncd read it from Redis); it was validated when the run was made."""
    regions = sorted({i["region"] for i in spec["config"]["islands"]})
    return parse_config(spec["config"], regions)
