"""A checkpoint of a run of source hf as a folder `transformers` loads unchanged
(config.json, model.safetensors, a README with the run's config), zipped for the
download (webapp/api/checkpoints.py)."""

from __future__ import annotations

import io
import json
import tempfile
import zipfile
from pathlib import Path

from diloco.hf import export
from diloco.island import gpt_config
from syncd.checkpoint import load
from webapp.runs.models import Checkpoint


def hf_folder_zip(checkpoint: Checkpoint) -> bytes:
    """The checkpoint's global model as a zipped Hugging Face folder.

    Raises:
        ValueError: the run is gone, its model is builtin, or the file does not load.
    """
    run = checkpoint.run
    if run is None:
        raise ValueError("This checkpoint's run was deleted; its model is unknown.")
    config = run.run_config()
    if config.model.source != "hf":
        raise ValueError("Only a run of model.source hf exports as a transformers folder; "
                         "download the checkpoint's file instead.")
    try:
        params = load(Path(checkpoint.path), checkpoint.sha256)[0]
    except (OSError, ValueError, RuntimeError) as e:
        raise ValueError(f"The checkpoint could not be loaded: {e}") from None
    with tempfile.TemporaryDirectory() as folder:
        export(gpt_config(config), params, Path(folder), _readme(checkpoint))
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
            for file in sorted(Path(folder).iterdir()):
                archive.write(file, file.name)
    return out.getvalue()


def _readme(checkpoint: Checkpoint) -> str:
    run = checkpoint.run
    return (f"# {run.name}, outer step {checkpoint.outer_step}\n\n"
            "Trained with Archipelago (decoupled DiLoCo). Load it with\n"
            "`AutoModelForCausalLM.from_pretrained(folder)`; its inputs are bytes\n"
            "(token id = byte value).\n\n"
            f"- held-out loss (validation split, nats per token): {checkpoint.eval_loss}\n"
            f"- fragment versions: {json.dumps(checkpoint.versions)}\n\n"
            "## The run's config\n\n```json\n"
            f"{json.dumps(run.config, indent=2, sort_keys=True)}\n```\n")
