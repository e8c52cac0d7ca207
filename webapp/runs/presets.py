"""A named preset's config (diloco/presets.py), fitted to the regions this deployment
has. The form offers them; the API takes any config."""

from __future__ import annotations

import copy
from typing import Any

from diloco.config import RunConfig
from diloco.presets import PRESETS


def preset_config(name: str, regions: list[str]) -> dict[str, Any]:
    """The full config of preset `name`, each island moved to a region of `regions`
    when its own is not there (regions in order of first use, so islands that shared a
    region still share one).

    Raises:
        ValueError: for an unknown preset or no regions.
    """
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; expected one of {', '.join(PRESETS)}")
    if not regions:
        raise ValueError("a deployment needs at least one region")
    config = {**RunConfig().to_dict(), **copy.deepcopy(PRESETS[name][1])}
    defaults = RunConfig().to_dict()
    for section, values in config.items():
        if isinstance(values, dict):
            config[section] = {**defaults[section], **values}
    wanted = list(dict.fromkeys(island["region"] for island in config["islands"]))
    missing = [r for r in wanted if r not in regions]
    spare = [r for r in regions if r not in wanted] or list(regions)
    mapping = {r: spare[i % len(spare)] for i, r in enumerate(missing)}
    island_defaults = RunConfig().to_dict()["islands"][0]
    config["islands"] = [{**island_defaults, **island,
                          "region": mapping.get(island["region"], island["region"])}
                         for island in config["islands"]]
    return config
