"""One island: a full model copy that runs its own inner AdamW loop.

The island never waits for other islands. After inner step t it sends the
updates of the fragments due at t (diloco.fragments.due_fragments),
and `overlap_steps` steps later it mixes in the newest global version of each
such fragment that has reached it (Streaming DiLoCo, arXiv 2501.18512):

    theta_p = lerp(global_p, theta_p, alpha)

An update is the increment since the island's last send of that fragment,
(anchor_p - theta_p) minus what it already sent against the same anchor, so a
second send before the merge of the first never counts the same progress
twice, and the part a lossy codec dropped is sent again later (error feedback).
An island process encodes and signs it on the island's encoding thread while
the next step's forward pass runs (send_update), not on the training thread.
The same class runs in the in-process cluster and in a worker's island process;
an island of several processes runs one on each, in a data-parallel group
(trainer/distributed.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

import torch

from diloco import codecs, hf
from diloco.config import ModelConfig, RunConfig, tokenizer_vocab
from diloco.data import Corpus, ShardSampler
from diloco.device import HostStaging, autocast, to_device
from diloco.fragments import Fragment
from diloco.hf import CausalLM, HFModelConfig
from diloco.model import GPT, GPTConfig, embedding_tensor_names
from diloco.shapes import VOCAB_SIZE
from diloco.synchronizer import Published, apply_published


class Group(Protocol):
    """The processes of an island of several (trainer.distributed.IslandGroup): each
    trains on its part of every batch, and gradients and losses are averaged over them."""

    world_size: int

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module: ...

    def part(self, batch: torch.Tensor) -> torch.Tensor: ...

    def mean(self, value: torch.Tensor) -> float: ...


@dataclass
class FragmentState:
    anchor: dict[str, torch.Tensor]  # the global version last mixed in
    version: int = 0
    sent: dict[str, torch.Tensor] | None = None  # decoded sum sent against this anchor
    tokens: int = 0  # since the last send
    inner_steps: int = 0
    sent_seq: int = -1  # the island's inner step at its last send


# A run's model: the builtin GPT, or a transformers causal LM (model.source hf); both
# take (idx, targets) and give (logits, loss), and carry what they were built from as
# their `config`.
Model = GPT | CausalLM


def gpt_config(config: RunConfig) -> GPTConfig | HFModelConfig:
    """What the run's model is built from: equal ones build the same tensors."""
    return model_shape(config.model, tokenizer_vocab(config))


def model_shape(m: ModelConfig, vocab_size: int = VOCAB_SIZE) -> GPTConfig | HFModelConfig:
    """What a model of these settings and the tokenizer's `vocab_size` is built from
    (raises HFConfigError for an hf model that cannot be built)."""
    if m.source == "hf":
        return hf.model_config(m.hf_config, m.block_size, vocab_size)
    return GPTConfig(n_layer=m.n_layer, n_embd=m.n_embd, n_head=m.n_head,
                     block_size=m.block_size, vocab_size=vocab_size)


def build_model(shape: GPTConfig | HFModelConfig, init: bool = True) -> Model:
    """The model of `shape`; with `init`, its weights drawn from torch's generator."""
    if isinstance(shape, HFModelConfig):
        return CausalLM(shape, init=init)
    return GPT(shape, init=init)


def initial_model(config: RunConfig) -> Model:
    """The model every island and the synchronizer start from, made from the seed."""
    shape = gpt_config(config)
    torch.manual_seed(config.seed)
    return build_model(shape)


def embedding_tensors(config: RunConfig, names: list[str]) -> tuple[str, ...]:
    """Of the model's tensor `names`, those RDA leaves alone: the embeddings."""
    if config.model.source == "hf":
        return hf.embedding_names(names)
    return embedding_tensor_names()


def inner_lr(step: int, peak: float, warmup_steps: int) -> float:
    """Linear warmup to `peak`, then constant: islands have no shared end to decay to."""
    if warmup_steps and step <= warmup_steps:
        return peak * step / warmup_steps
    return peak


class Island:
    """An island's model, inner optimizer, data shard and per-fragment sync state.

    Args:
        index: position in the run's island list; also picks the data shard.
        config: the run config.
        corpus: the loaded corpus; the island trains on shard `index` of M.
        fragments: the partition shared with the synchronizer.
        init_state: the global starting parameters; None keeps the model's own (the
            caller then sets every fragment with reset_fragment).
        device: where the model lives ("cpu", "cuda:0").
        group: the island's processes when it has several (islands[].processes); this
            process then trains on its part of each batch. None: one process.
        model: a model already built (a warm standby's), used when its shape is the
            run's; otherwise a new one is built.
    """

    def __init__(self, index: int, config: RunConfig, corpus: Corpus, fragments: list[Fragment],
                 init_state: dict[str, torch.Tensor] | None, device: str = "cpu",
                 group: Group | None = None, model: Model | None = None):
        if not 0 <= index < len(config.islands):
            raise ValueError(f"island index must be between 0 and {len(config.islands) - 1}, "
                             f"got {index}")
        self.index = index
        self.island_config = config.islands[index]
        self.name = self.island_config.name
        self.config = config
        self.device = device
        if group is not None and group.world_size != self.island_config.processes:
            raise ValueError(f"island {self.name!r} has {self.island_config.processes} "
                             f"processes in the run config, but its group has "
                             f"{group.world_size}")
        self.group = group
        shape = gpt_config(config)
        reuse = model is not None and model.config == shape
        self.model = (model if reuse else build_model(shape)).to(device)
        if init_state is not None:
            self.model.load_state_dict(init_state)
        # DDP averages the gradients over the group's ranks during backward.
        self.forward = group.wrap(self.model) if group else self.model
        self.staging = HostStaging(device)
        o = config.optim
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=o.inner_lr,
                                           betas=(0.9, 0.95), weight_decay=o.weight_decay)
        self.sampler = ShardSampler(corpus, index, len(config.islands), config.model.block_size,
                                    config.seed)
        self.fragments = fragments
        self.params = dict(self.model.named_parameters())
        self.state = [FragmentState(anchor={n: self.params[n].detach().clone()
                                            for n in f.tensor_names}) for f in fragments]
        self.step = 0
        self.tokens = 0
        self.last_loss = math.nan
        self._encoder: ThreadPoolExecutor | None = None  # send_update's, made at its first
        self._encoding: Future | None = None

    def move_to(self, step: int, tokens: int) -> None:
        """Take this place in training: the next inner step's number and the tokens
        trained so far (the other ranks of an island take rank 0's)."""
        self.step, self.tokens = step, tokens

    def set_fragment_counts(self, p: int, version: int, tokens: int, inner_steps: int) -> None:
        """Fragment p's version and the tokens and inner steps since its last send, as
        rank 0 of the island has them; nothing of it counts as sent."""
        self.finish_encoding()
        s = self.state[p]
        s.version, s.tokens, s.inner_steps, s.sent = version, tokens, inner_steps, None

    def unwrap(self) -> None:
        """Train on the bare model from now on, letting go of the group's wrapper (DDP):
        the last thing before the group is closed."""
        self.forward = self.model

    @property
    def tokens_per_step(self) -> int:
        return self.island_config.batch_size * self.config.model.block_size

    def inner_step(self) -> float:
        """One AdamW step on a batch of this island's shard; returns the loss."""
        self.step += 1
        lr = inner_lr(self.step, self.config.optim.inner_lr, self.config.optim.warmup_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        # Every rank draws the whole batch (the same, from the same cursor) and keeps its part.
        x, y = self.sampler.batch(self.island_config.batch_size)
        if self.group:
            x, y = self.group.part(x), self.group.part(y)
        with autocast(self.device, self.config.train.precision):
            _, loss = self.forward(to_device(x, self.device), to_device(y, self.device))
        self.finish_encoding()  # no increment is held while the gradients are
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        # The gradients go now, not at the next step: between steps (sends, pulls,
        # mixes) the island holds no gradient, a model's worth less at its peak.
        self.optimizer.zero_grad(set_to_none=True)
        self.tokens += self.tokens_per_step
        for s in self.state:
            s.tokens += self.tokens_per_step
            s.inner_steps += 1
        self.last_loss = self.group.mean(loss) if self.group else loss.item()
        return self.last_loss

    @torch.no_grad()
    def make_update(self, p: int, codec: str) -> tuple[dict, dict[str, torch.Tensor]]:
        """The encoded update (increment) of fragment p and its metadata, made
        on this thread (send_update makes it on the island's encoding thread)."""
        self.finish_encoding()
        meta, increment = self._take_increment(p)
        return meta, self._encode(p, increment, codec)

    def send_update(self, p: int, codec: str,
                    deliver: Callable[[dict, dict[str, torch.Tensor]], None]) -> dict:
        """Take fragment p's update (increment) now and encode it on the island's
        encoding thread, which then calls deliver(meta, payload); returns the metadata.
        The training thread goes on with the next step's forward pass meanwhile. What
        reads or writes what was sent (a send, a mix, a reset) waits for the encoding
        first, and so does the backward pass: the increment and its codes are freed
        before the gradients are made, so the island's peak is what it was. An error
        of the encoding or of deliver is raised there, on the training thread."""
        self.finish_encoding()
        meta, increment = self._take_increment(p)

        def encode() -> None:
            deliver(meta, self._encode(p, increment, codec))

        if self._encoder is None:
            self._encoder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="encode")
        self._encoding = self._encoder.submit(encode)
        return meta

    def finish_encoding(self) -> None:
        """Wait until the update being encoded is delivered (none: at once)."""
        encoding, self._encoding = self._encoding, None
        if encoding is not None:
            encoding.result()

    @torch.no_grad()
    def _take_increment(self, p: int) -> tuple[dict, dict[str, torch.Tensor]]:
        """Fragment p's increment since its last send (anchor minus parameters, less
        what was sent against the anchor) and its metadata; its counts start again."""
        s = self.state[p]
        increment = {n: s.anchor[n] - self.params[n].detach() for n in s.anchor}
        if s.sent is not None:
            for n, t in increment.items():
                t.sub_(s.sent[n])
        s.sent_seq = self.step
        meta = {"fragment": p, "base_version": s.version, "tokens": s.tokens,
                "inner_steps": s.inner_steps, "seq": self.step}
        s.tokens = 0
        s.inner_steps = 0
        return meta, increment

    @torch.no_grad()
    def _encode(self, p: int, increment: dict[str, torch.Tensor],
                codec: str) -> dict[str, torch.Tensor]:
        """The increment encoded where the model lives; only the encoded tensors come to
        the host (on a GPU the codes of a lossy codec, an eighth of the fragment for
        int4). What was sent, decoded, stays there too, for the mix."""
        s = self.state[p]
        encoded = codecs.encode(increment, codec)
        shapes = {n: tuple(t.shape) for n, t in increment.items()}
        decoded = codecs.decode(encoded, codec, shapes)
        s.sent = decoded if s.sent is None else {n: s.sent[n] + decoded[n] for n in decoded}
        return self.staging.to_host(encoded)

    @torch.no_grad()
    def mix_global(self, p: int, global_tensors: dict[str, torch.Tensor], version: int) -> None:
        """Mix in a global fragment; it becomes the new anchor.

        theta_p = lerp(global_p, theta_p, alpha). What no update carries yet is
        kept on top: the inner steps trained since the last send (the overlap,
        tau > 0) and what a lossy codec dropped from the sends. So the lerp uses
        theta_p as the synchronizer received it (anchor minus the decoded sends)
        and the rest is added back. Without that, every mix would throw away tau
        steps of this island's work.
        """
        self.finish_encoding()
        alpha = self.config.sync.alpha
        s = self.state[p]
        for n, g in self.staging.to_device(global_tensors).items():
            # In place, the anchor too (a fresh tensor of a fragment's size is paged in
            # anew). x.lerp_(g, 1 - alpha) is lerp(g, x, alpha) to the bit (but at
            # alpha 0.5), and g itself at alpha 0.
            theta = self.params[n]
            if s.sent is None:
                theta.lerp_(g, 1.0 - alpha)
            else:
                at_send = s.anchor[n] - s.sent[n]
                theta.sub_(at_send).add_(at_send.lerp_(g, 1.0 - alpha))
            s.anchor[n].copy_(g)
        s.version = version
        s.sent = None

    def mix_published(self, p: int, published: list[Published], version: int) -> None:
        """Mix in global fragment p as the messages pulled make it (oldest first): a
        whole fragment, or differences applied on the host to the anchor's copy there."""
        anchor = {n: t.cpu() for n, t in self.state[p].anchor.items()}
        shapes = {n: tuple(t.shape) for n, t in anchor.items()}
        self.mix_global(p, apply_published(anchor, published, shapes), version)

    @torch.no_grad()
    def reset_fragment(self, p: int, global_tensors: dict[str, torch.Tensor],
                       version: int) -> None:
        """Take a global fragment whole, dropping local progress (an elastic restart)."""
        self.finish_encoding()
        s = self.state[p]
        for n, g in self.staging.to_device(global_tensors).items():
            self.params[n].copy_(g)
            s.anchor[n].copy_(g)
        s.version = version
        s.sent = None
        s.tokens = 0
        s.inner_steps = 0

    def fragment_params(self, p: int) -> dict[str, torch.Tensor]:
        return {n: self.params[n].detach() for n in self.fragments[p].tensor_names}
