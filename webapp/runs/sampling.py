"""Sample: a checkpoint's model continuing a prompt, so people see what was learned.

The model is byte-level: the prompt's UTF-8 bytes go in, bytes come out and are
decoded with replacement for the odd split character.
"""

from __future__ import annotations

from pathlib import Path

import torch

from diloco.island import initial_model
from syncd.checkpoint import load
from webapp.runs.models import Checkpoint

MAX_PROMPT_CHARS = 2000
MAX_SAMPLE_TOKENS = 500


def sample(checkpoint: Checkpoint, prompt: str, tokens: int = 200, temperature: float = 0.8,
           seed: int = 0) -> str:
    """The text the checkpoint's model writes after `prompt` (the continuation only).

    Args:
        checkpoint: a stored checkpoint; its run's config gives the model's shape.
        prompt: the text to continue, 1 to MAX_PROMPT_CHARS characters.
        tokens: how many bytes to generate, 1 to MAX_SAMPLE_TOKENS.
        temperature: softmax temperature, above 0.
        seed: the sampling seed, so a sample can be repeated.

    Raises:
        ValueError: for a bad argument, or a checkpoint that does not verify or load.
    """
    if not isinstance(prompt, str) or not prompt:
        raise ValueError("prompt must be some text to continue.")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise ValueError(f"prompt must be at most {MAX_PROMPT_CHARS} characters, "
                         f"got {len(prompt)}.")
    try:
        prompt_bytes = prompt.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"prompt must be text that UTF-8 can encode: {e.reason} at "
                         f"character {e.start}.") from None
    if not isinstance(tokens, int) or not 1 <= tokens <= MAX_SAMPLE_TOKENS:
        raise ValueError(f"tokens must be between 1 and {MAX_SAMPLE_TOKENS}, got {tokens!r}.")
    if not temperature > 0:
        raise ValueError(f"temperature must be above 0, got {temperature!r}.")
    if checkpoint.run is None:
        raise ValueError("This checkpoint's run was deleted; its model shape is unknown.")
    model = initial_model(checkpoint.run.run_config())
    try:
        params, _, _, _ = load(Path(checkpoint.path), checkpoint.sha256)
        model.load_state_dict(params)
    except (OSError, ValueError, RuntimeError) as e:
        raise ValueError(f"The checkpoint could not be loaded: {e}") from None
    model.eval()
    idx = torch.tensor([list(prompt_bytes)[-model.config.block_size:]],
                       dtype=torch.long)
    generator = torch.Generator().manual_seed(seed)
    out = model.generate(idx, tokens, temperature=temperature, generator=generator)
    return bytes(out[0, idx.shape[1]:].tolist()).decode("utf-8", errors="replace")
