"""How much memory a run needs, from its config alone: the parameter count and the
bytes each part holds at its peak (an upper bound, not a typical value), so that a
user sees them before starting and a run that would not fit is refused (admission
uses the peak); and beside each island host's peak, its expected bytes: what an
island holds at its typical high-water mark in steady state.

Notation: B is the fp32 model (4 bytes x parameters); F the largest fragment in
fp32; B_up, F_up and B_down the model and that fragment encoded with
sync.compression and sync.downlink_compression (diloco/codecs.py: none 4
bytes a value, bf16 2, int8 1 plus a float32 scale per block of 64 values, int4
half a byte plus the same scales; r = B_up / B is about 1, 0.5, 0.27 and 0.14);
M the islands, P the fragments, S sync.max_staleness; B_m the outer momentum,
one fp32 buffer per parameter (diloco/merge.py OuterOptimizer), B when
optim.outer_momentum > 0 and else 0. D = S x B_down is the published
differences kept for a lossy downlink, 0 for none. Wire headers are left out.

Redis (syncd/store.py), the data plane: globals B (full fragments) + one fragment
in swap F (a publish writes the new version before it deletes the one before)
only where syncd does not serve them from its files (`served` False, SYNCD_SERVE
off; syncd/published_server.py: served, they lie in syncd's files, in the page
cache of syncd's host, and never on the data plane; the outer momentum is in
syncd's files only either way, syncd/published_files.py) + update messages
U x F_up in flight, U = sync.upload_slots (an island writes one only while it holds
one of the run's U upload slots, syncd/upload_slots.py, and each is freed once
folded into its round), whatever M + D + 64 MiB base.

syncd: globals B + momentum B_m + round sums B (one running sum per fragment,
diloco/fold.py, whatever M) + an update being folded F + merge
temporaries 2F (the merged update and the new fragment) + the message
being published F (the new fragment signed, as it goes to the data plane and
syncd's file) + D + evaluation
B (syncd/evaluation.py reads the globals in place, so the versions that merges
replace while it runs stay alive until it ends) + its process's base, counted once
however many runs it serves (SYNCD_BASE_BYTES, 512 MiB: the interpreter with torch,
Django and the project imported, measured at 344-374 MiB serving no run, and the
heap that serving runs adds past these parts, measured at up to 98 MiB). Checkpoints
are written tensor by tensor (syncd/checkpoint.py) and add nothing that counts.

Island, per process (diloco/island.py, trainer/runner.py, trainer/link.py):
parameters B + gradients B + AdamW moments 2B + anchors B (the global version of
every fragment last mixed in) + sent B (what was sent against each anchor, at
most every fragment) + DDP gradient buckets B with processes > 1 + an update
being made 2F + 2F_up (the increment and its decoding, the payload and its
message) + the send queue (2P + 1) x F_up (trainer.link.Link: 2P waiting, one on
the wire) + sent messages kept until handled k x B_up (trainer/resend.py: k =
kept_sends, 2 float32 messages of each fragment, up to 4 of a compressed uplink in
a run of two or three islands; sent again to a restarted syncd) + a global
fragment being pulled 2F (its message and its tensors) +
activations. An island host holds every process of its island, and its pool's
warm standby islands (trainer/pool.py, ISLAND_POOL_SIZE of them when it is a
number; with auto the pool fits itself into what the islands leave): each is an
interpreter with torch and the project imported (STANDBY_BASE_BYTES, measured
at 226 MiB on CPU) and a model built in the run's shape, B (the corpus it opens
is memory-mapped: page cache the host's islands share, not counted).

Island, expected, per process: what it holds at the backward pass of the step after
a send, its high-water mark in steady state (its heap keeps a step's buffers below 32
MiB from step to step, syncd/malloc.py, so every step reaches it again): parameters
B + gradients B (made by the backward pass, freed after the optimizer's step) + AdamW
moments 2B + anchors B + DDP gradient buckets B with processes > 1 + sent since the
last mix, n x F (each fragment's decoded sends stay until its mix, tau =
sync.overlap_steps steps after its send) + kept until handled, B_up (one message of
each fragment, its last: trainer/resend.py keeps it by reference until the next send
of that fragment finds it handled, and the link's queue holds the same objects) + a
fragment being pulled n x F_down (the global's message, downloaded while the tau
steps run and mixed after them, trainer/downloads.py; its payload's tensors are views
of it with codec none) + activations. n = ceil(tau x P / H), at most P: the unmixed
fragments (sent, not mixed yet) at once, one sent every H / P steps and each mixed tau
steps later; 0 with tau = 0, which mixes before its next step. Left out, as from the
peak: the interpreter and imports (a cold island's first step imports more of torch,
which a warm standby paid before it idles), and `transformers` itself for an hf model,
imported with its first model. Not in it, where the peak counts them: an update being made (encoded
during the forward pass and freed before the backward pass), a send queue beyond the
kept messages, and a second kept message of a fragment, which only a syncd that falls
behind leaves.

Activations are an estimate, after Korthikanti et al. 2022 ("Reducing
Activation Recomputation in Large Transformer Models", section 4.1): per layer
s x b x h x (34 + 5 x a x s / h) bytes with 16-bit activations, for b the
sequences of one process (batch_size / processes), s = block_size,
h = n_embd, a = n_head (an hf model's layers, width and heads from its library
config, and its logits besides: 8 bytes a value of its vocabulary, float32 and their
gradient, which its large vocabulary makes a large part); twice that for
train.precision fp32. It counts
dropout masks this model does not have and attention scores that a fused
attention kernel does not keep, so it is on the high side.

Wire bytes per outer step (`wire_per_outer_step`), per island: in an outer step (H
inner steps) an island sends one update of each fragment, B_up in all, and pulls each
fragment's newest version: with a lossy sync.downlink_compression its difference,
B_down in all, with none the fp32 fragment, B. Each of these 2P messages takes its
link's latency and its bytes (scaled by emulation.bytes_scale, as the emulated link
scales them) at the island's bandwidth (diloco/wan.py transfer_time). One version per
fragment: with min_quorum below the islands a fragment merges about M/K times per outer
step, and an island behind pulls each difference it missed (the full fragment when it
is more than S behind); wire headers are left out.
"""

from __future__ import annotations

from dataclasses import dataclass

from diloco.codecs import BLOCK
from diloco.config import CODECS, RunConfig, tokenizer_vocab
from diloco.fragments import partition
from diloco.shapes import tensor_sizes
from diloco.wan import transfer_time

MIB = 1024 * 1024
REDIS_BASE_BYTES = 64 * MIB
# syncd's RSS before any run's parts: an idle `manage.py syncd` (no run) read 344 MiB
# (psutil, after 20 s) and bench scale's syncd_idle_bytes 369-374 MiB; serving a run
# adds up to 98 MiB past the run's parts (bench scale --quick at 1M parameters: 117 MiB
# above idle against 19 MiB of parts; malloc arenas, Redis replies, the evaluation's
# batch), once, not per run (two tiny runs: 12-16 MiB). 374 + 98 rounded up.
SYNCD_BASE_BYTES = 512 * MIB
STANDBY_BASE_BYTES = 256 * MIB
# Messages per fragment an island keeps until handled, and the most of a fragment it
# has not seen handled before its next send waits (trainer/resend.py): see kept_sends.
KEPT_SENDS = 2
KEPT_SENDS_COMPRESSED = 4
ROUND_UPDATES = 8


def kept_sends(codec: str, islands: int) -> int:
    """Messages of each fragment an island keeps until syncd handled them (its
    backpressure bound, trainer/resend.py), under uplink `codec` in a run of `islands`.

    KEPT_SENDS: one in an open round, one on the way while the tau overlap steps run.
    With a compressed uplink, more where the run's islands together would keep fewer
    than ROUND_UPDATES, up to KEPT_SENDS_COMPRESSED (no more bytes than two float32
    messages: bf16 halves a message, int8 and int4 take a quarter and about an
    eighth). A merge and its publish cost syncd about what folding two or three
    updates does, and while it runs islands that hold all their kept sends send
    nothing; with so few islands that a round is two to six updates, that dead time
    is a large share of syncd's (bench dataplane at M = 2). More
    islands keep it full already, and deeper queues there would only make each
    update wait longer for its merge.

    Raises:
        ValueError: an unknown codec, or no islands.
    """
    if codec not in CODECS:
        raise ValueError(f"codec must be one of {', '.join(CODECS)}, got {codec!r}")
    if islands < 1:
        raise ValueError(f"a run has at least one island, got {islands}")
    if codec == "none":
        return KEPT_SENDS
    return max(KEPT_SENDS, min(KEPT_SENDS_COMPRESSED, -(-ROUND_UPDATES // islands)))


def unmixed_fragments(inner_steps: int, fragments: int, overlap_steps: int) -> int:
    """The unmixed fragments an island typically has at once, between their send and
    their mix: one is sent every inner_steps / fragments steps and mixed
    `overlap_steps` (tau) later; none with tau 0, where the island mixes before its next
    step.

    Raises:
        ValueError: fewer than one inner step or fragment, or a negative tau.
    """
    if inner_steps < 1 or fragments < 1:
        raise ValueError(f"a run has at least one inner step and one fragment, got "
                         f"inner_steps {inner_steps} and fragments {fragments}")
    if overlap_steps < 0:
        raise ValueError(f"overlap_steps must be 0 or more, got {overlap_steps}")
    return min(fragments, -(-overlap_steps * fragments // inner_steps))


def expected_process(model: int, largest: int, largest_down: int, up: int, unmixed: int,
                     activations: dict[str, int], ddp: bool) -> dict[str, int]:
    """An island process's expected bytes by part, at its typical high-water mark (the
    backward pass of the step after a send): the model `model` in float32 and its
    gradients, AdamW moments and anchors; DDP's buckets when `ddp`; the decoded sends and
    the pulled global messages of `unmixed` fragments, sent and not mixed yet (`largest`:
    the largest fragment in float32, `largest_down`: its downlink message); one kept
    message of each fragment (`up`: the model encoded for the uplink); `activations`
    (activation bytes by part, as the peak counts them)."""
    return {"parameters": model, "gradients": model, "AdamW moments": 2 * model,
            "anchors": model, "sent since the last mix": unmixed * largest,
            "DDP gradient buckets": model if ddp else 0,
            "kept until handled": up, "fragment being pulled": unmixed * largest_down,
            **activations}


def encoded_bytes(numel: int, codec: str) -> int:
    """Bytes of one tensor of `numel` values encoded with `codec` (diloco/codecs.py)."""
    if codec == "none":
        return 4 * numel
    if codec == "bf16":
        return 2 * numel
    blocks = -(-numel // BLOCK)
    scales = 4 * blocks
    if codec == "int8":
        return blocks * BLOCK + scales
    if codec == "int4":
        return -(-blocks * BLOCK // 2) + scales
    raise ValueError(f"codec must be one of none, bf16, int8, int4, got {codec!r}")


def activation_bytes(batch: int, block_size: int, n_layer: int, n_embd: int, n_head: int,
                     precision: str) -> int:
    """Activations kept for the backward pass (Korthikanti et al. 2022): an estimate."""
    per_layer_16bit = batch * block_size * (34 * n_embd + 5 * n_head * block_size)
    return n_layer * per_layer_16bit * (2 if precision == "fp32" else 1)


def _activations(config: RunConfig, batch: int) -> dict[str, int]:
    """An island process's activations by the model's layers (an hf model's from its
    library config), and an hf model's logits: float32, and their gradient."""
    m, precision = config.model, config.train.precision
    if m.source != "hf":
        return {"activations": activation_bytes(batch, m.block_size, m.n_layer, m.n_embd,
                                                m.n_head, precision)}
    from diloco.hf import layer_shape

    layers, width, heads, vocab = layer_shape(m.hf_config, m.block_size,
                                              tokenizer_vocab(config))
    return {"activations": activation_bytes(batch, m.block_size, layers, width, heads,
                                            precision),
            "logits": 2 * 4 * batch * m.block_size * vocab}


@dataclass(frozen=True)
class Need:
    """The bytes one part of the system holds, by what holds them."""

    parts: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.parts.values())


@dataclass(frozen=True)
class Estimate:
    params: int
    model_bytes: int  # B
    redis: Need
    syncd: Need
    islands: dict[str, Need]  # per island host, its peak: every process of the island
    expected: dict[str, Need]  # per island host, its typical high-water mark

    def to_dict(self) -> dict:
        def need(n: Need) -> dict:
            return {"total": n.total, "parts": n.parts}

        return {"params": self.params, "model_bytes": self.model_bytes,
                "redis": need(self.redis), "syncd": need(self.syncd),
                "islands": {name: need(n) for name, n in self.islands.items()},
                "expected": {name: need(n) for name, n in self.expected.items()}}


def estimate(config: RunConfig, standbys: int = 0, served: bool = True) -> Estimate:
    """The parameters, the peak bytes of Redis, syncd and each island host of a run,
    and each island host's expected bytes; `standbys` is the warm standby islands each
    island host keeps (ISLAND_POOL_SIZE);
    `served` whether syncd serves the full fragments from its files (SYNCD_SERVE) rather
    than putting them on the data plane.

    Raises:
        ValueError: when sync.fragments is more than the model's tensors.
    """
    sizes = tensor_sizes(config.model, tokenizer_vocab(config))
    s = config.sync
    params = sum(sizes.values())
    model = 4 * params
    up = sum(encoded_bytes(n, s.compression) for n in sizes.values())
    fragments = partition(sizes, s.fragments)
    largest = 4 * max(f.numel for f in fragments)
    largest_up = max(fragment_bytes(sizes, s.fragments, s.compression))
    largest_down = max(fragment_bytes(sizes, s.fragments, s.downlink_compression))
    unmixed = unmixed_fragments(s.inner_steps, s.fragments, s.overlap_steps)
    differences = 0 if s.downlink_compression == "none" else s.max_staleness * sum(
        encoded_bytes(n, s.downlink_compression) for n in sizes.values())
    momentum = model if config.optim.outer_momentum > 0 else 0
    published = {} if served else {"global fragments": model, "fragment in swap": largest}
    redis = Need({**published, "update messages": s.upload_slots * largest_up,
                  "downlink differences": differences,
                  "base": REDIS_BASE_BYTES})
    syncd = Need({"global fragments": model, "outer momentum": momentum,
                  "round sums": model, "update being folded": largest,
                  "merge temporaries": 2 * largest, "message being published": largest,
                  "downlink differences": differences, "evaluation": model,
                  "base": SYNCD_BASE_BYTES})
    islands, expected = {}, {}
    for island in config.islands:
        activations = _activations(config, island.batch_size // island.processes)
        per_process = {
            "parameters": model, "gradients": model, "AdamW moments": 2 * model,
            "anchors": model, "sent since the last mix": model,
            "DDP gradient buckets": model if island.processes > 1 else 0,
            "update being made": 2 * largest + 2 * largest_up,
            "send queue": (2 * s.fragments + 1) * largest_up,
            "kept until handled": kept_sends(s.compression, len(config.islands)) * up,
            "fragment being pulled": 2 * largest, **activations}
        typical = expected_process(model, largest, largest_down, up, unmixed, activations,
                                   island.processes > 1)
        pool = {"warm standbys": standbys * (STANDBY_BASE_BYTES + model)} if standbys else {}
        islands[island.name] = _host(per_process, island.processes, pool)
        expected[island.name] = _host(typical, island.processes, pool)
    return Estimate(params, model, redis, syncd, islands, expected)


@dataclass(frozen=True)
class Wire:
    """One island's wire bytes per outer step each way, and the seconds its link takes
    for them."""

    up_bytes: int
    down_bytes: int
    up_s: float
    down_s: float

    def to_dict(self) -> dict[str, int | float]:
        return {"up_bytes": self.up_bytes, "down_bytes": self.down_bytes,
                "up_s": self.up_s, "down_s": self.down_s}


def fragment_bytes(sizes: dict[str, int], fragments: int, codec: str) -> list[int]:
    """Bytes of each of the `fragments` fragments of tensors of `sizes` (name -> values)
    encoded with `codec`: one message each (diloco/fragments.py partition)."""
    return [sum(encoded_bytes(sizes[n], codec) for n in f.tensor_names)
            for f in partition(sizes, fragments)]


def link_seconds(messages: list[int], bandwidth_gbps: float, latency_ms: float,
                 bytes_scale: float = 1.0) -> float:
    """Seconds a link takes for `messages` (bytes each) one after the other."""
    return sum(transfer_time(n, bandwidth_gbps, latency_ms, bytes_scale) for n in messages)


def wire_per_outer_step(config: RunConfig) -> dict[str, Wire]:
    """Island name -> its wire bytes per outer step (one update of each fragment up, each
    fragment's newest version down) and its link's seconds for them.

    Raises:
        ValueError: when sync.fragments is more than the model's tensors.
    """
    sizes = tensor_sizes(config.model, tokenizer_vocab(config))
    s = config.sync
    up = fragment_bytes(sizes, s.fragments, s.compression)
    # A lossy downlink publishes encoded differences; none the fp32 fragment, which is
    # the codec none's encoding.
    down = fragment_bytes(sizes, s.fragments, s.downlink_compression)
    scale = config.emulation.bytes_scale
    return {i.name: Wire(sum(up), sum(down),
                         link_seconds(up, i.bandwidth_gbps, i.latency_ms, scale),
                         link_seconds(down, i.bandwidth_gbps, i.latency_ms, scale))
            for i in config.islands}


def _host(per_process: dict[str, int], processes: int, pool: dict[str, int]) -> Need:
    """An island host's need: each part of one process times its processes, and its
    warm standbys."""
    return Need({**{k: v * processes for k, v in per_process.items()}, **pool})
