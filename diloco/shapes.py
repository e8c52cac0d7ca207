"""The shapes of diloco/model.py's GPT as arithmetic: the name and size of each of its
tensors, without torch.

A model of source hf (diloco/hf.py) has the shapes of the transformers model it is.
The config's limits (the largest model a run may ask for, a fragment per tensor at
most), the memory sizing and the fragment plan need them before any model is built,
in processes (the web app's form and API) that never import torch. A test builds the
model and checks the two agree (tests/diloco/test_shapes.py).
"""

from __future__ import annotations

from typing import Protocol

VOCAB_SIZE = 256  # the bytes tokenizer's: the 256 byte values (diloco/tokenizer.py)


class ModelShape(Protocol):
    """The settings the shapes depend on (diloco.config.ModelConfig has them)."""

    source: str
    hf_config: str
    n_layer: int
    n_embd: int
    block_size: int


def tensor_sizes(model: ModelShape, vocab_size: int = VOCAB_SIZE) -> dict[str, int]:
    """Name -> values of each tensor of diloco.model.GPT with these settings, in its
    order (untied embeddings, no biases in the linear layers, two LayerNorms per block
    and one at the end). A model of source hf is the library's own, built on the meta
    device (diloco.hf.tensor_sizes; imports torch and transformers). `vocab_size` is
    the tokenizer's (diloco.config.tokenizer_vocab): the builtin model's embedding
    rows, and an hf config's vocab_size where it names none.

    Raises:
        diloco.hf.HFConfigError (a ValueError): an hf model that cannot be built.
    """
    if model.source == "hf":
        from diloco import hf

        return hf.tensor_sizes(model.hf_config, model.block_size, vocab_size)
    n = model.n_embd
    sizes = {"tok_emb.weight": vocab_size * n, "pos_emb.weight": model.block_size * n}
    for i in range(model.n_layer):
        sizes.update({f"blocks.{i}.{name}": numel for name, numel in (
            ("ln_1.weight", n), ("ln_1.bias", n), ("attn.c_attn.weight", 3 * n * n),
            ("attn.c_proj.weight", n * n), ("ln_2.weight", n), ("ln_2.bias", n),
            ("mlp.c_fc.weight", 4 * n * n), ("mlp.c_proj.weight", 4 * n * n))})
    sizes.update({"ln_f.weight": n, "ln_f.bias": n, "lm_head.weight": vocab_size * n})
    return sizes


def parameter_count(model: ModelShape, vocab_size: int = VOCAB_SIZE) -> int:
    """The parameters of diloco.model.GPT with these settings."""
    return sum(tensor_sizes(model, vocab_size).values())
