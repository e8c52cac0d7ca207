"""What a new run may read and start from, and whether it fits the memory the hosts
declare: checks that name the problem in a sentence for a form or an API field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings

from diloco.config import RunConfig, parse_config
from diloco.sizes import MIB, Need, estimate
from webapp.runs.models import Checkpoint


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


def memory_misfits(config: RunConfig) -> dict[str, list[str]]:
    """What of a run does not fit the memory the hosts declare ({} when it all fits).

    Redis against settings.REDIS_MAXMEMORY_MB, keyed "model"; each island host against
    settings.ISLAND_HOST_MEMORY_MB, keyed "islands.<i>.batch_size" when the island fits
    without its activations, else "model" (once: the first island that does not fit).
    """
    sized = estimate(config, settings.ISLAND_POOL_SIZE)
    errors: dict[str, list[str]] = {}
    redis_mb = settings.REDIS_MAXMEMORY_MB
    if sized.redis.total > redis_mb * MIB:
        errors["model"] = [
            f"Redis would need about {_shown(sized.redis.total)} for this run "
            f"({_parts(sized.redis)}), more than REDIS_MAXMEMORY_MB allows ({redis_mb:,} "
            "MiB): a smaller model, fewer islands or a lossy sync.compression would fit."]
    host_mb = settings.ISLAND_HOST_MEMORY_MB
    model_too_large = False
    for i, island in enumerate(config.islands):
        need = sized.islands[island.name]
        if need.total <= host_mb * MIB:
            continue
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
    return errors


def size_report(config: Any) -> dict[str, Any]:
    """The parameters and memory of a run config (diloco/sizes.py), the limits the
    hosts declare, and what does not fit them.

    Raises:
        ConfigError: when `config` (decoded JSON) is not a valid run config.
    """
    run_config = parse_config(config, settings.REGIONS)
    return {**estimate(run_config, settings.ISLAND_POOL_SIZE).to_dict(),
            "limits": {"redis_bytes": settings.REDIS_MAXMEMORY_MB * MIB,
                       "island_host_bytes": settings.ISLAND_HOST_MEMORY_MB * MIB},
            "misfits": memory_misfits(run_config)}


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
