"""The eval loss of a model's parameters on a held-out split: one evaluator for the
in-process cluster, syncd's live evaluations and the benchmarks' figures, so that a
loss means the same wherever it is read: in nats per token, and in bits per byte, the
figure comparable across tokenizers (issue 48).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from diloco.config import RunConfig
from diloco.data import Corpus, bytes_per_token, eval_batches
from diloco.island import build_model, gpt_config


def bits_per_byte(loss: float, per_token: float) -> float:
    """A held-out loss in nats per token as bits per byte of the text, for `per_token`
    bytes of text per token (diloco.data.bytes_per_token: 1.0 for the bytes tokenizer,
    where it is the loss in bits)."""
    if not per_token > 0:
        raise ValueError(f"bytes per token must be above 0, got {per_token}")
    return loss / math.log(2) / per_token


class Evaluator:
    """The loss of a model's parameters on a held-out split of the corpus.

    Args:
        config: the run's config (model and eval.tokens).
        corpus: the run's corpus.
        split: "validation" for what a run watches and tuning compares, "test" for a
            benchmark's reported figure (diloco/data.py).
        device: where the loss is computed; parameters elsewhere are copied there.
    """

    def __init__(self, config: RunConfig, corpus: Corpus, split: str, device: str = "cpu"):
        self.device = device
        # Bytes of text per token of this split's text: bits per byte divide by it.
        self.bytes_per_token = bytes_per_token(corpus.meta, split)
        with torch.device("meta"):  # no tensors of its own: each call assigns them
            self.model = build_model(gpt_config(config), init=False)
        self.batches = [(x.to(device), y.to(device)) for x, y in
                        eval_batches(corpus, split, config.eval.tokens, config.model.block_size)]

    def __call__(self, params: dict[str, torch.Tensor]) -> float:
        """The eval loss of `params`, which the model takes as they are (no copy) when
        they are on the evaluator's device: they are only read."""
        windows = self.window_losses(params)
        return sum(windows) / len(windows)

    @torch.no_grad()
    def window_losses(self, params: dict[str, torch.Tensor]) -> list[float]:
        """Each held-out window's mean loss under `params`, in the windows' order (the
        same windows every call): the eval loss is their mean, and two models compared
        window by window share each window's difficulty."""
        self.model.load_state_dict({n: t.to(self.device) for n, t in params.items()},
                                   assign=True)
        self.model.eval()
        windows: list[float] = []
        for x, y in self.batches:
            logits, _ = self.model(x)
            losses = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten(),
                                     reduction="none")
            windows += losses.view(len(x), -1).mean(dim=1).tolist()
        self.model.to_empty(device="meta")  # let go of the tensors until the next call
        return windows
