"""Sampling text from a language model: the one loop every model of the run shares.

GPT (diloco/model.py) and the transformers CausalLM (diloco/hf.py) both delegate here;
it imports only torch, so neither model module imports the other.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
import torch.nn.functional as F


class Sampled(Protocol):
    """A model to sample from: called on tokens it returns (logits, loss), and its
    config's block_size is the longest context it reads."""

    config: Any

    def __call__(self, idx: torch.Tensor) -> tuple[torch.Tensor, Any]: ...


@torch.no_grad()
def generate(model: Sampled, idx: torch.Tensor, max_new_tokens: int,
             temperature: float = 0.8, generator: torch.Generator | None = None) -> torch.Tensor:
    """`idx` (batch, tokens) with `max_new_tokens` more drawn one at a time from the
    model's next-token distribution at `temperature`, each on the last block_size tokens."""
    for _ in range(max_new_tokens):
        logits, _ = model(idx[:, -model.config.block_size:])
        probs = F.softmax(logits[:, -1, :] / max(temperature, 1e-4), dim=-1)
        idx = torch.cat((idx, torch.multinomial(probs, 1, generator=generator)), dim=1)
    return idx
