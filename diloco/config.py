"""The run config: one schema for the form, the API, the runtime and the benchmarks.

A run config is a tree of small dataclasses. Each field carries its bounds and a
one-line help in its metadata, and the rules between fields, which no field's bounds
can say, are a table (RULES) beside them, so the validator (diloco/config_parse.py),
the form and the docs read the same facts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from diloco import tokenizer as tokenizers
from diloco.shapes import tensor_sizes
from diloco.tradeoffs import help_text

CODECS = ("none", "bf16", "int8", "int4")
WEIGHTINGS = ("tokens", "uniform")
STALENESS_WEIGHTINGS = ("none", "cosine")
# decoupled: the quorum and grace window; sync: synchronous DiLoCo, every alive island's
# update in each merge, which every island waits for (sync.min_quorum the number of
# islands, sync.overlap_steps 0: MODE_RULES); elastic: data-parallel with whole-job
# restarts.
RUN_MODES = ("decoupled", "sync", "elastic")
DEVICES = ("auto", "cpu", "cuda")
PRECISIONS = ("fp32", "bf16")
# Who makes an island's wide-area link take its time: the island process (latency +
# bytes x bytes_scale x 8 / bandwidth, diloco/wan.py) or nobody, the real network doing it.
LINKS = ("process", "none")
# Where a run's model comes from: the project's byte-level GPT (diloco/model.py), or a
# causal LM of the transformers library built from model.hf_config (diloco/hf.py).
MODEL_SOURCES = ("builtin", "hf")


def setting(default: Any, help: str, lo: float | None = None, hi: float | None = None,
         choices: tuple[str, ...] | None = None, optional: bool = False) -> Any:
    """A dataclass field with validation facts in its metadata."""
    meta = {"help": help, "lo": lo, "hi": hi, "choices": choices, "optional": optional}
    return field(default=default, metadata=meta)


@dataclass
class ModelConfig:
    source: str = setting("builtin", "builtin: the project's byte-level GPT (n_layer, n_embd, "
                          "n_head); hf: a causal LM of the transformers library built from "
                          "model.hf_config.", choices=MODEL_SOURCES)
    hf_config: str = setting("", "With source hf: a local folder (inside DATA_ROOTS) holding "
                             "config.json, or the config inline as a JSON object (model_type "
                             "and its fields); weights drawn from the seed, nothing fetched, "
                             "no remote code.")
    n_layer: int = setting(2, "Transformer blocks.", 1, 48)
    n_embd: int = setting(64, "Width of the residual stream.", 8, 4096)
    n_head: int = setting(4, "Attention heads.", 1, 64)
    block_size: int = setting(64, "Context length in bytes.", 8, 4096)


@dataclass
class DataConfig:
    path: str = setting("", "A text, JSON Lines (.jsonl) or Parquet (.parquet) file, or a "
                         "folder of them; empty: the Python standard library's own sources.")
    eval_fraction: float = setting(0.05, "Share of the files in each held-out split: "
                                      "validation (live eval loss, tuning) and test (benchmark "
                                      "figures); train keeps the rest.", 0.01, 0.45)
    tokenizer: str = setting("bytes", "bytes: a token per byte (256 ids); train: a byte-level "
                             "BPE of data.vocab_size ids trained on the corpus once; or a "
                             "local folder (inside DATA_ROOTS) holding a tokenizer.json.")
    vocab_size: int = setting(8192, "With data.tokenizer train: the ids of the trained BPE "
                              "(the 256 bytes, an EOS and merges).", 257, 1 << 20)
    text_field: str = setting("text", "The field of a JSON Lines record (the column of a "
                              "Parquet file) that holds its text.")


@dataclass
class SyncConfig:
    inner_steps: int = setting(50, "H: inner steps between two syncs of one fragment.", 1, 100000)
    fragments: int = setting(4, "P: the parameters are cut into this many fragments.", 1, 64)
    overlap_steps: int = setting(1, "tau: inner steps an island trains before it mixes in the "
                                 "global fragment it sent for (0: wait for the merge). "
                                 + help_text("overlap_steps"), 0, 100000)
    wait_share: float = setting(0.35, "tau >= 1, mode decoupled: wait for each merge while it "
                                "slows the run's pace at most this share (syncd/waiting.py); "
                                "0: never. " + help_text("wait_share"), 0.0, 1.0)
    alpha: float = setting(0.0, "Mixing weight of the local fragment (0: replace with the "
                        "global). " + help_text("alpha"), 0.0, 1.0)
    min_quorum: int = setting(2, "K: updates needed before a fragment may merge. "
                              + help_text("min_quorum"), 1, 1024)
    grace_gamma: float = setting(1.0, "Scales the adaptive grace window after quorum (0: none). "
                              + help_text("grace_gamma"), 0.0, 100.0)
    weighting: str = setting("tokens", "How updates are weighted in a merge.", choices=WEIGHTINGS)
    rda: bool = setting(False, "Radial-directional averaging for non-embedding tensors.")
    compression: str = setting("none", "Codec of updates sent up.", choices=CODECS)
    downlink_compression: str = setting("none", "Codec of global fragments sent down.",
                                     choices=CODECS)
    max_staleness: int = setting(4, "Updates based on a version older than newest minus this "
                                 "are dropped.", 0, 1000)
    merge_each_period: bool = setting(
        True, "Merge a fragment once per synchronization period, with what arrived from "
        "the quorum by then, as the paper does: a round that reached its quorum waits "
        "for the islands expected within the period (each H of its own inner steps "
        "after its last update), not for a straggler; false: as soon as quorum and "
        "grace allow. "
        + help_text("merge_each_period"))
    staleness_weighting: str = setting(
        "none", "cosine: an update's weight, and its round's outer step, scaled by "
        "(1 + cos(pi x age / (max_staleness + 1))) / 2 of its age (versions between its "
        "anchor and the merge); none: every age alike.", choices=STALENESS_WEIGHTINGS)
    upload_slots: int = setting(2, "Update messages of all islands on the data plane at once: "
                                "an island waits for a slot before it writes one, so Redis "
                                "holds this many whatever the number of islands.", 1, 1024)


@dataclass
class OptimConfig:
    inner_lr: float = setting(4e-4, "Peak AdamW learning rate of the inner loop.", 1e-6, 1.0)
    outer_lr: float = setting(0.7, "Learning rate of the outer Nesterov SGD.", 1e-4, 10.0)
    outer_momentum: float = setting(0.9, "Momentum of the outer SGD (Nesterov; 0: plain SGD).",
                                 0.0, 0.999)
    weight_decay: float = setting(0.1, "AdamW weight decay.", 0.0, 1.0)
    warmup_steps: int = setting(100, "Linear warmup of the inner learning rate.", 0, 1000000)


@dataclass
class EvalConfig:
    interval_steps: int = setting(100, "Evaluate the global model every this many inner steps.",
                                1, 1000000)
    tokens: int = setting(16384, "Held-out tokens per evaluation.", 256, 10000000)


@dataclass
class CheckpointConfig:
    interval_s: float = setting(60.0, "Seconds between periodic checkpoints.", 1.0, 86400.0)
    keep: int = setting(3, "Checkpoints kept per run.", 1, 1000)


@dataclass
class LivenessConfig:
    heartbeat_timeout_s: float = setting(10.0, "An island silent this long is lost.", 0.5, 3600.0)


@dataclass
class ElasticConfig:
    restart_delay_s: float | None = setting(None, "Pause of a whole-job restart; empty: measured.",
                                         0.0, 3600.0, optional=True)


@dataclass
class EmulationConfig:
    link: str = setting("process", "Who makes a message take its time on an island's link: "
                        "process, the island process holds it for latency + bytes x 8 / "
                        "bandwidth; none, the network between the hosts does (a real "
                        "deployment), bandwidth_gbps and latency_ms then only size syncd's "
                        "grace window until the islands have measured their sends and "
                        "pulls.", choices=LINKS)
    bytes_scale: float = setting(1.0, "The link emulator treats each fragment as this many times "
                                   "larger.", 1.0, 1e9)


CHAOS_PRESETS = ("none", "aggressive", "moderate", "kills_only")


@dataclass
class ChaosConfig:
    preset: str = setting("none", "A seeded fault schedule syncd carries out on the run "
                               "(diloco/chaos.py presets; none: no faults).",
                       choices=CHAOS_PRESETS)
    seed: int = setting(0, "Seeds the fault schedule: the same seed breaks the same islands "
                        "at the same times.", 0, 2**31 - 1)


@dataclass
class BudgetConfig:
    total_tokens: int = setting(2_000_000, "The run completes after training this many tokens.",
                             1000, 10**13)


@dataclass
class TrainConfig:
    device: str = setting("auto", "Where islands train; auto: cuda when the host has a GPU.",
                       choices=DEVICES)
    precision: str = setting("fp32", "Inner-step arithmetic; bf16: autocast of the forward pass, "
                                  "fp32 parameters and optimizer.", choices=PRECISIONS)


@dataclass
class IslandConfig:
    name: str = setting("", "Unique within the run.")
    region: str = setting("", "A region that has a worker.")
    batch_size: int = setting(8, "Sequences per inner step.", 1, 4096)
    speed: float = setting(1.0, "Relative speed; 0.5 takes twice as long per inner step.",
                           0.01, 100.0)
    bandwidth_gbps: float = setting(2.0, "Emulated wide-area bandwidth.", 1e-4, 1000.0)
    latency_ms: float = setting(30.0, "Emulated one-way latency.", 0.0, 10000.0)
    processes: int = setting(1, "Data-parallel processes (GPUs) of the island; each takes an "
                             "equal part of batch_size.", 1, 64)


SECTIONS: dict[str, type] = {
    "model": ModelConfig, "data": DataConfig, "sync": SyncConfig, "optim": OptimConfig,
    "eval": EvalConfig, "checkpoint": CheckpointConfig, "liveness": LivenessConfig,
    "elastic": ElasticConfig, "emulation": EmulationConfig, "budget": BudgetConfig,
    "chaos": ChaosConfig,
    "train": TrainConfig,
}
MAX_ISLANDS = 256
MAX_TEXT = 1000  # characters of any text field
MAX_ISLAND_NAME = 64
# The largest model a run may ask for: every island, syncd (globals and outer momentum)
# and each checkpoint hold it whole, in float32.
MAX_PARAMS = 2_000_000_000


def default_islands() -> list[IslandConfig]:
    return [IslandConfig(name="island-0", region="us-east"),
            IslandConfig(name="island-1", region="us-east")]


@dataclass
class RunConfig:
    seed: int = setting(0, "Seeds the model, the data order and the island shards.", 0, 2**31 - 1)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    sync: SyncConfig = field(default_factory=SyncConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    liveness: LivenessConfig = field(default_factory=LivenessConfig)
    elastic: ElasticConfig = field(default_factory=ElasticConfig)
    emulation: EmulationConfig = field(default_factory=EmulationConfig)
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    chaos: ChaosConfig = field(default_factory=ChaosConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    islands: list[IslandConfig] = field(default_factory=default_islands)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def round_tokens(self) -> int:
        """Tokens all islands train in one outer period of H inner steps."""
        return self.sync.inner_steps * self.model.block_size * sum(
            i.batch_size for i in self.islands)

    def island_index(self, name: str) -> int:
        for i, island in enumerate(self.islands):
            if island.name == name:
                return i
        raise KeyError(f"no island named {name!r}")


@dataclass(frozen=True)
class Rule:
    """A rule between fields, which no field's bounds can say.

    Args:
        field: the field it constrains, as the docs name it ("sync.min_quorum"; a
            field of every island as "islands.processes"; "model" for the whole model).
        summary: the rule in a sentence, for the help and the API's schema.
        problems: (dotted path, message) for each place a config breaks it.
    """

    field: str
    summary: str
    problems: Callable[[RunConfig], Iterator[tuple[str, str]]]


def tokenizer_vocab(config: RunConfig) -> int:
    """The ids of the run's tokenizer (diloco.tokenizer.vocab_of), which the builtin
    model's embedding has and an hf config names where it names no vocab_size; 256 (the
    bytes') for a tokenizer that cannot be read, which its own rule reports."""
    try:
        return tokenizers.vocab_of(config.data)
    except tokenizers.TokenizerError:
        return tokenizers.BYTE_VOCAB


def _sizes(config: RunConfig) -> dict[str, int] | None:
    """The model's tensor sizes; None when model.hf_config cannot be built (its own
    rule says why)."""
    try:
        return tensor_sizes(config.model, tokenizer_vocab(config))
    except ValueError:
        return None


def _hf_model_builds(config: RunConfig) -> Iterator[tuple[str, str]]:
    m = config.model
    if m.source != "hf":
        if m.hf_config:
            yield "model.hf_config", "Only with model.source hf; leave it empty."
        return
    from diloco.hf import HFConfigError, model_config

    try:
        model_config(m.hf_config, m.block_size)
    except HFConfigError as e:
        yield "model.hf_config", str(e)


def _heads_divide_width(config: RunConfig) -> Iterator[tuple[str, str]]:
    m = config.model
    if m.source == "builtin" and m.n_embd % m.n_head:
        yield "model.n_head", f"Must divide model.n_embd ({m.n_embd}), got {m.n_head}."


def _model_fits(config: RunConfig) -> Iterator[tuple[str, str]]:
    sizes = _sizes(config)
    params = sum(sizes.values()) if sizes else 0
    if params > MAX_PARAMS:
        yield "model", (f"The model would have {params:,} parameters; at most {MAX_PARAMS:,} "
                        "are allowed (fewer model.n_layer or a smaller model.n_embd).")


def _quorum_of_islands(config: RunConfig) -> Iterator[tuple[str, str]]:
    n, k = len(config.islands), config.sync.min_quorum
    if not 1 <= k <= n:
        yield "sync.min_quorum", f"Must be between 1 and the number of islands ({n}), got {k}."


def _fragments_of_tensors(config: RunConfig) -> Iterator[tuple[str, str]]:
    sizes = _sizes(config)
    tensors, p = len(sizes or {}), config.sync.fragments
    if sizes is not None and p > tensors:
        how = "8 x model.n_layer + 5 = " if config.model.source == "builtin" else ""
        yield "sync.fragments", ("Must be at most the number of the model's tensors "
                                 f"({how}{tensors}), got {p}.")


def _fragments_of_steps(config: RunConfig) -> Iterator[tuple[str, str]]:
    s = config.sync
    if s.fragments > s.inner_steps:
        yield "sync.fragments", (f"Must be at most sync.inner_steps ({s.inner_steps}), "
                                 f"got {s.fragments}.")


def _overlap_within_steps(config: RunConfig) -> Iterator[tuple[str, str]]:
    s = config.sync
    if s.overlap_steps >= s.inner_steps:
        yield "sync.overlap_steps", (f"Must be less than sync.inner_steps ({s.inner_steps}), "
                                     f"got {s.overlap_steps}.")


def _eval_of_blocks(config: RunConfig) -> Iterator[tuple[str, str]]:
    block, tokens = config.model.block_size, config.eval.tokens
    if tokens < block:
        yield "eval.tokens", f"Must be at least model.block_size ({block}), got {tokens}."


def _scale_needs_the_emulation(config: RunConfig) -> Iterator[tuple[str, str]]:
    e = config.emulation
    if e.link == "none" and e.bytes_scale != 1.0:
        yield "emulation.bytes_scale", ("Must be 1 with emulation.link none (no emulated link "
                                        f"to scale), got {e.bytes_scale}.")


def _processes_divide_batch(config: RunConfig) -> Iterator[tuple[str, str]]:
    for i, island in enumerate(config.islands):
        if island.batch_size % island.processes:
            yield f"islands.{i}.processes", (f"Must divide islands.{i}.batch_size "
                                             f"({island.batch_size}), got {island.processes}.")


RULES = (
    Rule("model.hf_config", "With model.source hf only: a buildable config of a causal LM.",
         _hf_model_builds),
    Rule("data.tokenizer", "A tokenizer that can be read, whose ids fit the model's "
         "embedding (an hf config's vocab_size, where it names one; the builtin model and "
         "an hf config naming none take the tokenizer's).",
         lambda config: tokenizers.problems(config.data, config.model)),
    Rule("model.n_head", "Must divide model.n_embd.", _heads_divide_width),
    Rule("model", f"At most {MAX_PARAMS:,} parameters (model.n_layer, model.n_embd).",
         _model_fits),
    Rule("sync.min_quorum", "At most the number of islands.", _quorum_of_islands),
    Rule("sync.fragments", "At most the model's tensors (builtin: 8 x model.n_layer + 5).",
         _fragments_of_tensors),
    Rule("sync.fragments", "At most sync.inner_steps.", _fragments_of_steps),
    Rule("sync.overlap_steps", "Less than sync.inner_steps.", _overlap_within_steps),
    Rule("eval.tokens", "At least model.block_size.", _eval_of_blocks),
    Rule("islands.processes", "Must divide batch_size.", _processes_divide_batch),
    Rule("emulation.bytes_scale", "1 with emulation.link none.", _scale_needs_the_emulation),
)


def _sync_quorum_of_all(config: RunConfig) -> Iterator[tuple[str, str]]:
    n, k = len(config.islands), config.sync.min_quorum
    if k != n:
        yield "sync.min_quorum", ("Must be the number of islands in mode sync (every island "
                                  f"in each merge): {n}, got {k}.")


def _sync_waits_for_merge(config: RunConfig) -> Iterator[tuple[str, str]]:
    tau = config.sync.overlap_steps
    if tau != 0:
        yield "sync.overlap_steps", ("Must be 0 in mode sync (each island waits for the merge "
                                     f"of its update), got {tau}.")


# The rules a run mode adds to RULES (mode_problems).
MODE_RULES: dict[str, tuple[Rule, ...]] = {
    "sync": (Rule("sync.min_quorum", "The number of islands in mode sync.", _sync_quorum_of_all),
             Rule("sync.overlap_steps", "0 in mode sync.", _sync_waits_for_merge)),
}


def mode_problems(mode: str, config: RunConfig) -> Iterator[tuple[str, str]]:
    """(dotted path, message) for each rule of the run mode the config breaks."""
    for rule in MODE_RULES.get(mode, ()):
        yield from rule.problems(config)


def with_mode_values(mode: str, config: RunConfig, given: Any) -> RunConfig:
    """The config with what its run mode fixes filled in where the user gave nothing:
    in mode sync, sync.min_quorum (every island) and sync.overlap_steps (0) that the
    decoded JSON `given` leaves out. A value the user gave stays, for mode_problems to
    judge."""
    if mode != "sync":
        return config
    sync = given.get("sync") if isinstance(given, dict) else None
    named = set(sync) if isinstance(sync, dict) else set()
    made = synchronous(config).sync
    return replace(config, sync=replace(
        config.sync,
        min_quorum=config.sync.min_quorum if "min_quorum" in named else made.min_quorum,
        overlap_steps=config.sync.overlap_steps if "overlap_steps" in named else 0))


def synchronous(config: RunConfig) -> RunConfig:
    """The config as mode sync runs it: every island in each merge, each island waiting
    for it (min_quorum M, overlap_steps 0), the rest the config's own."""
    return replace(config, sync=replace(config.sync, min_quorum=len(config.islands),
                                        overlap_steps=0))


def rule_summaries() -> dict[str, str]:
    """Field -> the rules between fields that constrain it, in the docs' words."""
    out: dict[str, str] = {}
    for rule in (*RULES, *(r for rules in MODE_RULES.values() for r in rules)):
        out[rule.field] = f"{out[rule.field]} {rule.summary}" if rule.field in out else rule.summary
    return out


def field_help() -> dict[str, str]:
    """Dotted path -> one-line help with the rules on the field, for the form and the docs."""
    rules = rule_summaries()
    out = {"seed": fields(RunConfig)[0].metadata["help"]}
    for name, cls in {**SECTIONS, "islands[]": IslandConfig}.items():
        for f in fields(cls):
            rule = rules.get(f"{name.removesuffix('[]')}.{f.name}")
            out[f"{name}.{f.name}"] = f"{f.metadata['help']} {rule}" if rule else f.metadata["help"]
    return out
