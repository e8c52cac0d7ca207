"""Causal language models of the Hugging Face `transformers` library (`model.source` hf).

`model.hf_config` names the model: a local folder holding a `config.json`, or the
config itself inline as a JSON object (its `model_type`, "llama", and its fields). The
model is built from that config alone, with random weights drawn from the run's seed,
so every island and syncd build the same one; nothing is fetched (no hub, no network)
and no code but the library's own runs (a config asking for remote code is refused).

`transformers` is imported only by the functions that build a model, so a builtin run
never loads it. `CausalLM` gives the library's model diloco.model.GPT's call
((idx, targets) -> (logits, loss), targets already shifted) and its tensors: its state
dict holds each parameter once (a tied weight under its first name), which is what
fragments, syncd and checkpoints carry.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from diloco import sampling

# The prefix of the library model's tensors in CausalLM's names ("lm.model.layers.0...").
PREFIX = "lm."


class HFConfigError(ValueError):
    """`model.hf_config` cannot be built; the message says why, for the field's error."""


@dataclass(frozen=True)
class HFModelConfig:
    """What a CausalLM is built from: the library config as canonical JSON, and the
    run's context length. Two models with equal ones have the same tensors."""

    hf_json: str
    block_size: int


def read_config(hf_config: str) -> dict[str, Any]:
    """The library config `model.hf_config` names: an inline JSON object, or the
    `config.json` of a local folder.

    Raises:
        HFConfigError: not a JSON object, no such folder, no config.json in it, no
            model_type, or a model that needs remote code (auto_map).
    """
    text = hf_config.strip()
    if text.startswith("{"):
        source = "the inline config"
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise HFConfigError(f"Not a JSON object: {e}.") from None
    else:
        folder = Path(text).expanduser()
        if not text or not folder.is_dir():
            raise HFConfigError(f"No folder at {text!r}: give a folder holding config.json "
                                "or an inline JSON config.")
        file = folder / "config.json"
        if not file.is_file():
            raise HFConfigError(f"The folder {text!r} holds no config.json.")
        source = str(file)
        try:
            data = json.loads(file.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise HFConfigError(f"{file} is not readable JSON: {e}.") from None
    if not isinstance(data, dict):
        raise HFConfigError(f"{source} must be a JSON object.")
    if "auto_map" in data or data.get("trust_remote_code"):
        raise HFConfigError(f"{source} needs remote code (auto_map), which is never run: "
                            "only the library's own architectures are built.")
    if not isinstance(data.get("model_type"), str):
        raise HFConfigError(f"{source} has no model_type (an architecture such as llama).")
    return data


def check_architecture(data: dict[str, Any]) -> None:
    """Raises HFConfigError unless the library builds a causal LM of data's model_type."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    model_type = data["model_type"]
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        known = ", ".join(k for k in ("llama", "qwen2", "gemma", "gpt2", "mistral")
                          if k in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
        raise HFConfigError(f"Unknown architecture {model_type!r}: transformers builds no "
                            f"causal LM of it (known ones include {known}).")


def model_config(hf_config: str, block_size: int, vocab_size: int | None = None
                 ) -> HFModelConfig:
    """The checked, canonical form of `model.hf_config` (raises HFConfigError), its
    vocab_size the tokenizer's `vocab_size` where it names none."""
    data = read_config(hf_config)
    check_architecture(data)
    if vocab_size is not None:
        data.setdefault("vocab_size", vocab_size)
    return HFModelConfig(json.dumps(data, sort_keys=True), block_size)


def library_config(config: HFModelConfig) -> Any:
    """The transformers config object of `config`: float32, SDPA attention, no cache."""
    from transformers import AutoConfig

    data = json.loads(config.hf_json)
    fields = {k: v for k, v in data.items() if k not in ("model_type", "architectures",
                                                          "transformers_version")}
    made = AutoConfig.for_model(data["model_type"], **fields)
    made.use_cache = False
    return made


class CausalLM(nn.Module):
    """A transformers causal LM behind diloco.model.GPT's call and tensors.

    Args:
        config: the library config and context length.
        init: draw the initial weights (from torch's generator, seeded by the caller);
            False leaves them as allocated, for a caller that assigns its own.
    """

    def __init__(self, config: HFModelConfig, init: bool = True):
        super().__init__()
        self.config = config
        if init:
            self.lm = _library_model(config)
        else:
            with torch.device("meta"):
                self.lm = _library_model(config)
        self.aliases = _tied_aliases(self)
        self.kept_buffers: dict[str, torch.Tensor] | None = None  # _restore_buffers's

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if idx.size(1) > self.config.block_size:
            raise ValueError(f"sequence length {idx.size(1)} exceeds block_size "
                             f"{self.config.block_size}")
        logits = self.lm(input_ids=idx).logits
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
        return logits, loss

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, torch.Tensor]:
        """Each tensor once: a tied weight's later names are left out."""
        out = super().state_dict(*args, **kwargs)
        prefix = kwargs.get("prefix", args[1] if len(args) > 1 else "")
        for alias in self.aliases:
            out.pop(prefix + alias, None)
        return out

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False
                        ) -> Any:
        """Loads a state_dict() of this model and ties the tied weights again."""
        result = super().load_state_dict(state_dict, strict=False, assign=assign)
        missing = set(result.missing_keys) - set(self.aliases)
        if strict and (missing or result.unexpected_keys):
            raise RuntimeError(f"state dict does not fit: missing {sorted(missing)}, "
                               f"unexpected {sorted(result.unexpected_keys)}")
        self.lm.tie_weights()
        self._restore_buffers()
        return result

    def _restore_buffers(self) -> None:
        """Made on the meta device (diloco/evaluation.py), the model's buffers that no
        state dict carries (rotary frequencies) are made once on the CPU, from the
        config, and put beside its parameters."""
        empty = [n for n, b in self.named_buffers() if b.is_meta]
        if not empty:
            return
        if self.kept_buffers is None:
            with torch.device("cpu"):
                made = _library_model(self.config)
            self.kept_buffers = {PREFIX + n: b for n, b in made.named_buffers()}
        device = next(self.parameters()).device
        for name in empty:
            module, _, leaf = name.rpartition(".")
            self.get_submodule(module)._buffers[leaf] = self.kept_buffers[name].to(device)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def generate(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 0.8,
                 generator: torch.Generator | None = None) -> torch.Tensor:
        return sampling.generate(self, idx, max_new_tokens, temperature, generator)


def _library_model(config: HFModelConfig) -> nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_config(library_config(config), dtype=torch.float32,
                                            attn_implementation="sdpa")


def _tied_aliases(model: nn.Module) -> tuple[str, ...]:
    """The state-dict names of model's parameters that are a later name of one already
    named (a tied output layer)."""
    first: dict[int, str] = {}
    aliases = []
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in first:
            aliases.append(name)
        else:
            first[id(p)] = name
    return tuple(aliases)


@functools.lru_cache(maxsize=16)
def tensor_sizes(hf_config: str, block_size: int, vocab_size: int | None = None
                 ) -> dict[str, int]:
    """Name -> values of each tensor of the model, in its order, each tied weight once:
    the model built on the meta device (no memory, no draw)."""
    config = model_config(hf_config, block_size, vocab_size)
    with torch.device("meta"):
        model = CausalLM(config, init=False)
    return {name: t.numel() for name, t in model.state_dict().items()}


@functools.lru_cache(maxsize=16)
def layer_shape(hf_config: str, block_size: int, vocab_size: int | None = None
                ) -> tuple[int, int, int, int]:
    """The model's layers, width, attention heads and vocabulary, for the activations'
    estimate (diloco/sizes.py)."""
    made = library_config(model_config(hf_config, block_size, vocab_size))
    return (made.num_hidden_layers, made.hidden_size, made.num_attention_heads,
            made.vocab_size)


def embedding_names(names: list[str]) -> tuple[str, ...]:
    """Tensors that RDA leaves alone: the input embeddings, whose rows are looked up."""
    return tuple(n for n in names if n.endswith("embed_tokens.weight") or
                 n.endswith(("wte.weight", "wpe.weight")))


def export(config: HFModelConfig, params: dict[str, torch.Tensor], folder: Path,
           readme: str) -> None:
    """Write `params` (a CausalLM's state dict) as a folder that transformers loads as it
    is (`AutoModelForCausalLM.from_pretrained(folder)`): config.json, model.safetensors
    (the library's own names, each tied weight as the library saves it) and README.md."""
    model = CausalLM(config, init=False)
    model.load_state_dict({n: t.detach().float().cpu() for n, t in params.items()},
                          assign=True)
    model.lm.config.use_cache = True  # as a user of the folder generates
    model.lm.save_pretrained(folder, safe_serialization=True)
    (folder / "README.md").write_text(readme)


def export_tokenizer(json_text: str, eos_token: str | None, block_size: int,
                     folder: Path) -> None:
    """Write the tokenizer of `json_text` (a tokenizer.json) into `folder` so that
    `AutoTokenizer.from_pretrained(folder)` loads it as it is: a PreTrainedTokenizerFast
    with its EOS (if any) and the run's context length as its model_max_length."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    made = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json_text),
                                   eos_token=eos_token, model_max_length=block_size)
    made.save_pretrained(folder)
