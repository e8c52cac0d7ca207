"""Sample: a checkpoint's model continuing a prompt, so people see what was learned.

The run's tokenizer (the one its checkpoint carries, else bytes) makes the prompt's
ids and reads the ids that come out; bytes are decoded with replacement for the odd
split character.

Any viewer may ask, so the work a request costs is bounded: the prompt and the
output by MAX_PROMPT_CHARS and MAX_SAMPLE_TOKENS, the checkpoints read by a cache
of the last MAX_CACHED_MODELS models built (by checkpoint id and sha256), and the
samples under way at once in this process by MAX_CONCURRENT_SAMPLES; one more is
refused (SamplerBusy), not queued.
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from diloco.island import Model, initial_model
from diloco.tokenizer import Tokenizer
from syncd.checkpoint import load, load_tokenizer
from webapp.runs.models import Checkpoint

MAX_PROMPT_CHARS = 2000
MAX_SAMPLE_TOKENS = 500
MAX_CACHED_MODELS = 2
MAX_CONCURRENT_SAMPLES = 2


class SamplerBusy(Exception):
    """Every slot is taken by a sample under way; ask again in a moment."""


class Sampler:
    """The models of the checkpoints sampled last (at most `cached`, least recently
    used out first) and the slots for samples under way (at most `concurrent`)."""

    def __init__(self, cached: int = MAX_CACHED_MODELS,
                 concurrent: int = MAX_CONCURRENT_SAMPLES):
        if cached < 1 or concurrent < 1:
            raise ValueError(f"cached and concurrent must be at least 1, got {cached} "
                             f"and {concurrent}.")
        self.cached = cached
        self.concurrent = concurrent
        self._models: OrderedDict[tuple[int, str], Model] = OrderedDict()
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(concurrent)

    @contextmanager
    def slot(self) -> Iterator[None]:
        """Hold one of the slots for as long as the block runs.

        Raises:
            SamplerBusy: when every slot is held.
        """
        if not self._slots.acquire(blocking=False):
            raise SamplerBusy(f"The sampler is busy with {self.concurrent} samples; "
                              "ask again in a few seconds.")
        try:
            yield
        finally:
            self._slots.release()

    def model(self, checkpoint: Checkpoint) -> Model:
        """The checkpoint's model in eval mode, read and built once while it is cached.

        Raises:
            ValueError: for a checkpoint whose run was deleted, or one that does not
                verify or load.
        """
        key = (checkpoint.pk, checkpoint.sha256)
        with self._lock:
            if key in self._models:
                self._models.move_to_end(key)
                return self._models[key]
        model = self._build(checkpoint)
        with self._lock:
            self._models[key] = model
            self._models.move_to_end(key)
            while len(self._models) > self.cached:
                self._models.popitem(last=False)
        return model

    def _build(self, checkpoint: Checkpoint) -> Model:
        if checkpoint.run is None:
            raise ValueError("This checkpoint's run was deleted; its model shape is unknown.")
        model = initial_model(checkpoint.run.run_config())
        try:
            params, _, _, _ = load(Path(checkpoint.path), checkpoint.sha256)
            model.load_state_dict(params)
        except (OSError, ValueError, RuntimeError) as e:
            raise ValueError(f"The checkpoint could not be loaded: {e}") from None
        return model.eval()


SAMPLER = Sampler()


def sample(checkpoint: Checkpoint, prompt: str, tokens: int = 200, temperature: float = 0.8,
           seed: int = 0, sampler: Sampler = SAMPLER) -> str:
    """The text the checkpoint's model writes after `prompt` (the continuation only).

    Args:
        checkpoint: a stored checkpoint; its run's config gives the model's shape.
        prompt: the text to continue, 1 to MAX_PROMPT_CHARS characters.
        tokens: how many bytes to generate, 1 to MAX_SAMPLE_TOKENS.
        temperature: softmax temperature, above 0.
        seed: the sampling seed, so a sample can be repeated.
        sampler: whose cache and slots it uses (the process's own by default).

    Raises:
        ValueError: for a bad argument, or a checkpoint that does not verify or load.
        SamplerBusy: when the sampler's slots are all taken.
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
    with sampler.slot():
        model = sampler.model(checkpoint)
        tokenizer = _tokenizer(checkpoint.path, checkpoint.sha256)
        ids = tokenizer.encode([prompt_bytes.decode()])[0] or [0]
        idx = torch.tensor([ids[-model.config.block_size:]], dtype=torch.long)
        generator = torch.Generator().manual_seed(seed)
        out = model.generate(idx, tokens, temperature=temperature, generator=generator)
    return tokenizer.decode(out[0, idx.shape[1]:].tolist())


@functools.lru_cache(maxsize=MAX_CACHED_MODELS)
def _tokenizer(path: str, sha256: str) -> Tokenizer:
    """The tokenizer a checkpoint carries; bytes where it carries none."""
    try:
        text = load_tokenizer(Path(path), sha256)
    except (OSError, ValueError) as e:
        raise ValueError(f"The checkpoint's tokenizer could not be read: {e}") from None
    return Tokenizer(text) if text is not None else Tokenizer()
