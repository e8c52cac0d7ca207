"""What a new run may read and start from: checks that name the problem in a
sentence for a form or an API field, "" when there is none."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings

from trainer.config import RunConfig
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
    source = checkpoint.run.config.get("model") if checkpoint.run else None
    model = config.get("model", {}) if isinstance(config, dict) else {}
    if source is not None and {**RunConfig().to_dict()["model"], **model} != source:
        return ("The run's model settings must be those of the checkpoint's run: "
                f"{source}.")
    return ""
