"""A checkpoint of a run of source hf as a folder `transformers` loads unchanged
(config.json, model.safetensors, the tokenizer's files, a README with the run's config
and how its held-out loss is computed), zipped for the download
(webapp/api/checkpoints.py)."""

from __future__ import annotations

import io
import json
import tempfile
import zipfile
from pathlib import Path

from diloco.hf import export, export_tokenizer
from diloco.island import gpt_config
from diloco.tokenizer import Tokenizer, byte_tokenizer_json
from syncd.checkpoint import load, load_tokenizer
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
        tokenizer = load_tokenizer(Path(checkpoint.path))
    except (OSError, ValueError, RuntimeError) as e:
        raise ValueError(f"The checkpoint could not be loaded: {e}") from None
    made = Tokenizer(tokenizer) if tokenizer is not None else None
    with tempfile.TemporaryDirectory() as folder:
        export(gpt_config(config), params, Path(folder), _readme(checkpoint, made))
        export_tokenizer(tokenizer or byte_tokenizer_json(), made and made.eos_token,
                         config.model.block_size, Path(folder))
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
            for file in sorted(Path(folder).iterdir()):
                archive.write(file, file.name)
    return out.getvalue()


def _readme(checkpoint: Checkpoint, tokenizer: Tokenizer | None) -> str:
    run = checkpoint.run
    config = run.run_config()
    tokens = ("bytes (token id = byte value; a document of records ends with id 0)"
              if tokenizer is None else f"the run's tokenizer (sha256 {tokenizer.sha256}, "
              f"{tokenizer.vocab_size} ids, EOS {tokenizer.eos_token!r})")
    return (f"# {run.name}, outer step {checkpoint.outer_step}\n\n"
            "Trained with Archipelago (decoupled DiLoCo). Load it with\n"
            "`AutoModelForCausalLM.from_pretrained(folder)` and\n"
            f"`AutoTokenizer.from_pretrained(folder)`; its tokens are {tokens}.\n\n"
            f"- held-out loss (validation split, nats per token): {checkpoint.eval_loss}\n"
            f"- how: the mean over {max(1, config.eval.tokens // config.model.block_size)} "
            f"windows of {config.model.block_size} tokens evenly spaced over the "
            "validation split of the prepared corpus (diloco.data.eval_batches), in "
            "batches of 32, each window's mean cross-entropy of the next token, fp32\n"
            f"- fragment versions: {json.dumps(checkpoint.versions)}\n\n"
            "## The run's config\n\n```json\n"
            f"{json.dumps(run.config, indent=2, sort_keys=True)}\n```\n")
