"""A small byte-level GPT, in the manner of nanoGPT's model.py.

The vocabulary is the 256 byte values, so any text file is a corpus and no
tokenizer has to be shipped or downloaded.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from diloco import sampling
from diloco.shapes import VOCAB_SIZE


@dataclass
class GPTConfig:
    n_layer: int = 2
    n_embd: int = 64
    n_head: int = 4
    block_size: int = 64
    vocab_size: int = VOCAB_SIZE


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.n_head = config.n_head
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=False)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=False)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """Args:
        config: the model's shape.
        init: draw the initial weights. False leaves the tensors as allocated, for a
            caller that assigns its own: on the meta device (diloco/evaluation.py) a
            normal draw goes through torch's Python reference of it, whose first use
            imports torch._dynamo and sympy (about 80 MB of memory for good).
    """

    def __init__(self, config: GPTConfig, init: bool = True):
        super().__init__()
        self.config = config
        self.tok_emb = _embedding(config.vocab_size, config.n_embd, init)
        self.pos_emb = _embedding(config.block_size, config.n_embd, init)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd)
        # No weight tying: with 256 byte values the embedding is tiny, and untied
        # tensors keep every parameter in exactly one fragment.
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if not init:
            return
        self.apply(self._init_weights)
        # Scaled init of the residual projections (GPT-2): keeps the residual
        # stream's variance from growing with depth.
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear | nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        seq_len = idx.size(1)
        if seq_len > self.config.block_size:
            raise ValueError(f"sequence length {seq_len} exceeds block_size "
                             f"{self.config.block_size}")
        pos = torch.arange(seq_len, device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.view(-1))
        return logits, loss

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def generate(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 0.8,
                 generator: torch.Generator | None = None) -> torch.Tensor:
        return sampling.generate(self, idx, max_new_tokens, temperature, generator)


def embedding_tensor_names() -> tuple[str, ...]:
    """Tensors that RDA leaves alone: their rows are looked up, not multiplied."""
    return ("tok_emb.weight", "pos_emb.weight")


def _embedding(rows: int, dim: int, init: bool) -> nn.Embedding:
    """An embedding table; without `init`, its weight is left as allocated (nn.Embedding
    draws one otherwise, and GPT._init_weights draws it again)."""
    if init:
        return nn.Embedding(rows, dim)
    return nn.Embedding(rows, dim, _weight=torch.empty(rows, dim))
