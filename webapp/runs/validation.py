"""What a new run may read and start from, and whether it fits the memory the hosts
declare: checks that name the problem in a sentence for a form or an API field."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings

from diloco.config import RunConfig
from diloco.config_parse import parse_config
from diloco.data import batch_shortfall, text_files
from diloco.sizes import (
    MIB,
    REDIS_BASE_BYTES,
    STANDBY_BASE_BYTES,
    SYNCD_BASE_BYTES,
    Estimate,
    Need,
    estimate,
    wire_per_outer_step,
)
from diloco.tokenizer import BYTES, TRAIN
from diloco.tradeoffs import tradeoffs
from webapp.runs.models import Checkpoint, Run


def check_data_path(path: str) -> str:
    """Why a run may not read `path` ("" when it may): it must resolve, with symlinks
    and ".." followed, inside one of settings.DATA_ROOTS. Empty is the default corpus."""
    if not path:
        return ""
    try:
        resolved = Path(path).expanduser().resolve()
    except (OSError, RuntimeError, ValueError) as e:  # a symlink loop, a bad name
        return f"Must be a path that can be resolved: {e}."
    roots = [Path(root).expanduser().resolve() for root in settings.DATA_ROOTS]
    if any(resolved.is_relative_to(root) for root in roots):
        return ""
    return (f"Must be a file or folder inside one of the data folders "
            f"({', '.join(str(root) for root in roots) or 'none configured'}; setting "
            f"DATA_ROOTS); {path!r} resolves to {resolved}.")


def check_corpus_path(config: Any) -> str:
    """Why a run may not read the corpus `data.path` names ("" when it may)."""
    data = config.get("data") if isinstance(config, dict) else None
    path = data.get("path") if isinstance(data, dict) else None
    return check_data_path(path) if isinstance(path, str) else ""


def check_model_folder(config: Any) -> str:
    """Why a run may not build its model from the folder `model.hf_config` names (""
    when it may, or names none: empty, or the config inline): the folder must lie inside
    DATA_ROOTS, as data.path must."""
    model = config.get("model") if isinstance(config, dict) else None
    folder = model.get("hf_config") if isinstance(model, dict) else None
    if not isinstance(folder, str) or not folder.strip() or folder.strip().startswith("{"):
        return ""
    return check_data_path(folder.strip())


def check_tokenizer_folder(config: Any) -> str:
    """Why a run may not read the tokenizer folder `data.tokenizer` names ("" when it
    may, or names bytes or train): it must lie inside DATA_ROOTS, as data.path must."""
    data = config.get("data") if isinstance(config, dict) else None
    folder = data.get("tokenizer") if isinstance(data, dict) else None
    if not isinstance(folder, str) or folder.strip() in ("", BYTES, TRAIN):
        return ""
    return check_data_path(folder.strip())


def check_corpus_size(config: RunConfig) -> str:
    """Why the corpus data.path names holds less than one batch for an island ("" when
    it holds one, or is the default corpus)."""
    if not config.data.path:
        return ""
    try:
        files = text_files(Path(config.data.path))
        total = sum(path.stat().st_size for _, path in files)
    except (OSError, ValueError) as e:
        return f"The corpus cannot be read: {e}."
    return batch_shortfall(total, config.data.eval_fraction, len(config.islands),
                           config.model.block_size, max(i.batch_size for i in config.islands))


def checkpoint_misfit(checkpoint: Checkpoint, config: Any) -> str:
    """Why a run with `config` cannot start from `checkpoint` ("" when it can)."""
    if not Path(checkpoint.path).is_file():
        return f"The checkpoint's file {checkpoint.path} is gone."
    if checkpoint.run is None:
        return ("The checkpoint's run was deleted: the model settings it was trained with "
                "are gone with it, so no run can start from it.")
    source = checkpoint.run.config.get("model")
    model = config.get("model") if isinstance(config, dict) else None
    model = model if isinstance(model, dict) else {}  # a bad model is the config's error
    if source is not None and {**RunConfig().to_dict()["model"], **model} != source:
        return ("The run's model settings must be those of the checkpoint's run: "
                f"{source}.")
    return ""


def fixed_standbys() -> int:
    """The standbys every island host keeps whatever runs: ISLAND_POOL_SIZE when it is
    a number; 0 with auto, whose pools fit themselves into the memory islands leave."""
    return settings.ISLAND_POOL_SIZE or 0


def served() -> bool:
    """Whether syncd serves the published fragments from its files (SYNCD_SERVE): then
    they take no data-plane memory (diloco.sizes)."""
    return settings.SYNCD_SERVE != "off"


def admitted_configs(excluding: Run | None = None) -> list[RunConfig]:
    """The configs of the admitted runs (Run.ADMITTED: queued, running, paused or stopping,
    whose memory is held), but `excluding`'s: what a run's admission adds itself to."""
    runs = Run.objects.admitted()
    if excluding is not None and excluding.pk is not None:
        runs = runs.exclude(pk=excluding.pk)
    return [run.run_config() for run in runs]


@dataclass(frozen=True)
class Taken:
    """What other admitted runs already take: Redis's bytes and syncd's (the base of
    each counted once, by the run admitted), and each region's island host's (its
    islands', without the warm standbys, which a host keeps once whatever runs), by
    region."""

    runs: int
    redis: int
    syncd: int
    hosts: dict[str, int]
    host_runs: dict[str, int]  # region -> how many of the runs have islands there
    models: dict[str, int]  # region -> the largest model among those runs'

    @classmethod
    def of(cls, configs: Sequence[RunConfig]) -> Taken:
        redis = syncd = 0
        hosts: Counter[str] = Counter()
        host_runs: Counter[str] = Counter()
        models: dict[str, int] = {}
        for config in configs:
            sized = estimate(config, served=served())
            redis += sized.redis.total - REDIS_BASE_BYTES
            syncd += sized.syncd.total - SYNCD_BASE_BYTES
            for island in config.islands:
                hosts[island.region] += sized.islands[island.name].total
                models[island.region] = max(models.get(island.region, 0), sized.model_bytes)
            host_runs.update({island.region for island in config.islands})
        return cls(len(configs), redis, syncd, dict(hosts), dict(host_runs), models)


def memory_misfits(config: RunConfig, others: Sequence[RunConfig] = ()) -> dict[str, list[str]]:
    """What of a run does not fit the memory the hosts declare, beside what the other
    admitted runs (`others`: admitted_configs) take ({} when it all fits).

    Summed over this run and `others`: Redis against settings.REDIS_MAXMEMORY_MB and
    syncd against settings.SYNCD_HOST_MEMORY_MB (several syncd split the runs, but the
    one left takes every run over), keyed "model"; each island alone against
    settings.ISLAND_HOST_MEMORY_MB, keyed "islands.<i>.batch_size" when the island fits
    without its activations, else "model" (once: the first island that does not fit);
    then each region's islands together, of every admitted run, against one island
    host's ISLAND_HOST_MEMORY_MB (a region's islands share its worker's host), keyed
    "islands.<i>.region" for this run's first island there that does not fit.
    """
    standbys = fixed_standbys()
    sized = estimate(config, standbys, served=served())
    taken = Taken.of(others)
    errors: dict[str, list[str]] = {}
    _shared_misfits(sized, taken, errors)
    alone_too_large = _island_misfits(config, sized, errors)
    _region_misfits(config, sized, taken, standbys, alone_too_large, errors)
    return errors


def _shared_misfits(sized: Estimate, taken: Taken, errors: dict[str, list[str]]) -> None:
    """Redis and syncd, each summed over this run and the other admitted runs."""
    redis_mb = settings.REDIS_MAXMEMORY_MB
    if sized.redis.total + taken.redis > redis_mb * MIB:
        errors["model"] = [
            f"Redis would need about {_shown(sized.redis.total)} for this run "
            f"({_parts(sized.redis)}){_others(taken.redis, taken.runs)}, more than "
            f"REDIS_MAXMEMORY_MB allows ({redis_mb:,} MiB): a smaller model, fewer "
            "sync.upload_slots or a lossy sync.compression would fit" + _later(taken.redis) + "."]
    syncd_mb = settings.SYNCD_HOST_MEMORY_MB
    if sized.syncd.total + taken.syncd > syncd_mb * MIB:
        errors.setdefault("model", []).append(
            f"syncd would need about {_shown(sized.syncd.total)} for this run "
            f"({_parts(sized.syncd)}){_others(taken.syncd, taken.runs)}, more than "
            f"SYNCD_HOST_MEMORY_MB allows ({syncd_mb:,} MiB): a smaller model or fewer "
            "islands would fit" + _later(taken.syncd) + ".")


def _island_misfits(config: RunConfig, sized: Estimate, errors: dict[str, list[str]]
                    ) -> set[str]:
    """Each island alone against its host; returns the regions of those that do not fit."""
    host_mb = settings.ISLAND_HOST_MEMORY_MB
    model_too_large = False
    alone_too_large: set[str] = set()
    for i, island in enumerate(config.islands):
        need = sized.islands[island.name]
        if need.total <= host_mb * MIB:
            continue
        alone_too_large.add(island.region)
        activations = need.parts["activations"]
        if need.total - activations <= host_mb * MIB:
            errors[f"islands.{i}.batch_size"] = [
                f"Island {island.name!r} would need about {_shown(need.total)}, "
                f"{_shown(activations)} of it activations (an estimate) at batch_size "
                f"{island.batch_size}, more than ISLAND_HOST_MEMORY_MB allows ({host_mb:,} "
                "MiB): a smaller batch_size would fit."]
        elif not model_too_large:
            model_too_large = True
            state = Need({k: v for k, v in need.parts.items() if k != "activations"})
            errors.setdefault("model", []).append(
                f"Island {island.name!r} would need about {_shown(need.total)}, "
                f"{_shown(state.total)} of it without activations ({_parts(state)}), more "
                f"than ISLAND_HOST_MEMORY_MB allows ({host_mb:,} MiB): a smaller model "
                "would fit.")
    return alone_too_large


def _region_misfits(config: RunConfig, sized: Estimate, taken: Taken, standbys: int,
                    said: set[str], errors: dict[str, list[str]]) -> None:
    """Each region's islands together, of every admitted run, against one island host;
    `said`: the regions whose host is already said not to fit (once each)."""
    host_mb = settings.ISLAND_HOST_MEMORY_MB
    mine: Counter[str] = Counter()  # this run's islands by region, standbys left out
    for i, island in enumerate(config.islands):
        region, need = island.region, sized.islands[island.name]
        mine[region] += need.total - need.parts.get("warm standbys", 0)
        pool = standbys * (STANDBY_BASE_BYTES + max(sized.model_bytes,
                                                    taken.models.get(region, 0)))
        there = taken.hosts.get(region, 0)
        if region in said or mine[region] + there + pool <= host_mb * MIB:
            continue
        said.add(region)
        ours = [other.name for other in config.islands[:i + 1] if other.region == region]
        errors[f"islands.{i}.region"] = [
            f"The island host of {region} would need about {_shown(mine[region])} for "
            f"this run's islands there ({', '.join(map(repr, ours))})"
            + (f" and {_shown(pool)} for its warm standbys" if pool else "")
            + _others(there, taken.host_runs.get(region, 0), f" in {region}")
            + f", more than ISLAND_HOST_MEMORY_MB allows ({host_mb:,} MiB): another "
            "region, a smaller batch_size or model would fit" + _later(there) + "."]


def size_report(config: Any) -> dict[str, Any]:
    """The parameters and memory of a run config (diloco/sizes.py), the limits the
    hosts declare, what the admitted runs already take of them, what does not fit, and
    each island's wire bytes per outer step with its link's seconds for them, and what
    its K, grace, alpha and tau cost in quality and speed (diloco/tradeoffs.py).

    Raises:
        ConfigError: when `config` (decoded JSON) is not a valid run config.
    """
    run_config = parse_config(config, settings.REGIONS)
    sync = run_config.sync
    others = admitted_configs()
    taken = Taken.of(others)
    return {**estimate(run_config, fixed_standbys(), served=served()).to_dict(),
            "limits": {"redis_bytes": settings.REDIS_MAXMEMORY_MB * MIB,
                       "syncd_host_bytes": settings.SYNCD_HOST_MEMORY_MB * MIB,
                       "island_host_bytes": settings.ISLAND_HOST_MEMORY_MB * MIB},
            "taken": {"runs": taken.runs, "redis_bytes": taken.redis,
                      "syncd_bytes": taken.syncd, "island_host_bytes": taken.hosts},
            "misfits": memory_misfits(run_config, others),
            "wire": {name: wire.to_dict()
                     for name, wire in wire_per_outer_step(run_config).items()},
            "tradeoffs": tradeoffs(sync.min_quorum, len(run_config.islands), sync.grace_gamma,
                                   sync.alpha, sync.overlap_steps, sync.wait_share,
                                   sync.merge_each_period)}


def _others(nbytes: int, runs: int, where: str = "") -> str:
    """", and the N other admitted runs take X already[ where]" ("" when none)."""
    if not nbytes:
        return ""
    who = "the other admitted run takes" if runs == 1 else \
        f"the {runs} other admitted runs take"
    return f", and {who} {_shown(nbytes)} already{where}"


def _later(taken: int) -> str:
    """What else would fit when other runs take some of a host: their end."""
    return ", or this run once others end" if taken else ""


def _shown(nbytes: int) -> str:
    if nbytes >= 1024 * MIB:
        return f"{nbytes / (1024 * MIB):.1f} GiB"
    if nbytes >= MIB:
        return f"{nbytes / MIB:.0f} MiB"
    return f"{nbytes / 1024:.0f} KiB"


def _parts(need: Need) -> str:
    """The three largest parts: what most of a need is made of."""
    largest = sorted(need.parts.items(), key=lambda kv: -kv[1])[:3]
    return ", ".join(f"{name} {_shown(nbytes)}" for name, nbytes in largest)
