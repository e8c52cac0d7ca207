"""The run config: one schema for the form, the API, the runtime and the benchmarks.

A run config is a tree of small dataclasses. Each field carries its bounds and a
one-line help in its metadata, so the validator, the form and the docs read the
same facts. `parse_config` turns untrusted JSON into a RunConfig or raises
ConfigError with messages keyed by dotted path ("sync.min_quorum",
"islands.2.region"), which the API returns as-is with status 422.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any

from diloco.shapes import parameter_count, tensor_sizes

CODECS = ("none", "bf16", "int8", "int4")
WEIGHTINGS = ("tokens", "uniform")
MODES = ("decoupled", "elastic")
DEVICES = ("auto", "cpu", "cuda")
PRECISIONS = ("fp32", "bf16")


def spec(default: Any, help: str, lo: float | None = None, hi: float | None = None,
         choices: tuple[str, ...] | None = None, optional: bool = False) -> Any:
    """A dataclass field with validation facts in its metadata."""
    meta = {"help": help, "lo": lo, "hi": hi, "choices": choices, "optional": optional}
    return field(default=default, metadata=meta)


@dataclass
class ModelConfig:
    n_layer: int = spec(2, "Transformer blocks.", 1, 48)
    n_embd: int = spec(64, "Width of the residual stream.", 8, 4096)
    n_head: int = spec(4, "Attention heads; must divide n_embd.", 1, 64)
    block_size: int = spec(64, "Context length in bytes.", 8, 4096)


@dataclass
class DataConfig:
    path: str = spec("", "A text file or folder of text files; empty: the Python standard "
                         "library's own sources.")
    eval_fraction: float = spec(0.05, "Share of the files in each held-out split: "
                                      "validation (live eval loss, tuning) and test (benchmark "
                                      "figures); train keeps the rest.", 0.01, 0.45)


@dataclass
class SyncConfig:
    inner_steps: int = spec(50, "H: inner steps between two syncs of one fragment.", 1, 100000)
    fragments: int = spec(4, "P: the parameters are cut into this many fragments.", 1, 64)
    overlap_steps: int = spec(1, "tau: inner steps an island trains before it mixes in the "
                                 "global fragment it sent for (0: wait for the merge).", 0, 100000)
    alpha: float = spec(0.0, "Mixing weight of the local fragment (0: replace with the global).",
                        0.0, 1.0)
    min_quorum: int = spec(2, "K: updates needed before a fragment may merge.", 1, 1024)
    grace_gamma: float = spec(1.0, "Scales the adaptive grace window after quorum (0: none).",
                              0.0, 100.0)
    weighting: str = spec("tokens", "How updates are weighted in a merge.", choices=WEIGHTINGS)
    rda: bool = spec(False, "Radial-directional averaging for non-embedding tensors.")
    compression: str = spec("none", "Codec of outer gradients sent up.", choices=CODECS)
    downlink_compression: str = spec("none", "Codec of global fragments sent down.",
                                     choices=CODECS)
    max_staleness: int = spec(4, "Updates based on a version older than newest minus this "
                                 "are dropped.", 0, 1000)


@dataclass
class OptimConfig:
    inner_lr: float = spec(4e-4, "Peak AdamW learning rate of the inner loop.", 1e-6, 1.0)
    outer_lr: float = spec(0.7, "Learning rate of the outer Nesterov SGD.", 1e-4, 10.0)
    outer_momentum: float = spec(0.9, "Momentum of the outer SGD (Nesterov; 0: plain SGD).",
                                 0.0, 0.999)
    weight_decay: float = spec(0.1, "AdamW weight decay.", 0.0, 1.0)
    warmup_steps: int = spec(100, "Linear warmup of the inner learning rate.", 0, 1000000)


@dataclass
class EvalConfig:
    interval_steps: int = spec(100, "Evaluate the global model every this many inner steps.",
                                1, 1000000)
    tokens: int = spec(16384, "Held-out tokens per evaluation.", 256, 10000000)


@dataclass
class CheckpointConfig:
    interval_s: float = spec(60.0, "Seconds between periodic checkpoints.", 1.0, 86400.0)
    keep: int = spec(3, "Checkpoints kept per run.", 1, 1000)


@dataclass
class LivenessConfig:
    heartbeat_timeout_s: float = spec(10.0, "An island silent this long is lost.", 0.5, 3600.0)


@dataclass
class ElasticConfig:
    restart_delay_s: float | None = spec(None, "Pause of a whole-job restart; empty: measured.",
                                         0.0, 3600.0, optional=True)


@dataclass
class EmulationConfig:
    bytes_scale: float = spec(1.0, "The link emulator treats each fragment as this many times "
                                   "larger.", 1.0, 1e9)


CHAOS_PRESETS = ("none", "aggressive", "moderate", "kills_only")


@dataclass
class ChaosConfig:
    preset: str = spec("none", "A seeded fault schedule syncd carries out on the run "
                               "(diloco/chaos.py presets; none: no faults).",
                       choices=CHAOS_PRESETS)
    seed: int = spec(0, "Seeds the fault schedule: the same seed breaks the same islands "
                        "at the same times.", 0, 2**31 - 1)


@dataclass
class BudgetConfig:
    total_tokens: int = spec(2_000_000, "The run completes after training this many tokens.",
                             1000, 10**13)


@dataclass
class TrainConfig:
    device: str = spec("auto", "Where islands train; auto: cuda when the host has a GPU.",
                       choices=DEVICES)
    precision: str = spec("fp32", "Inner-step arithmetic; bf16: autocast of the forward pass, "
                                  "fp32 parameters and optimizer.", choices=PRECISIONS)


@dataclass
class IslandConfig:
    name: str = spec("", "Unique within the run.")
    region: str = spec("", "A region that has a worker.")
    batch_size: int = spec(8, "Sequences per inner step.", 1, 4096)
    speed: float = spec(1.0, "Relative speed; 0.5 takes twice as long per inner step.", 0.01, 100.0)
    bandwidth_gbps: float = spec(2.0, "Emulated wide-area bandwidth.", 1e-4, 1000.0)
    latency_ms: float = spec(30.0, "Emulated one-way latency.", 0.0, 10000.0)
    processes: int = spec(1, "Data-parallel processes (GPUs) of the island; each takes an "
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
    seed: int = spec(0, "Seeds the model, the data order and the island shards.", 0, 2**31 - 1)
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


class ConfigError(ValueError):
    """Raised with every problem of a config, keyed by dotted path."""

    def __init__(self, errors: dict[str, list[str]]):
        self.errors = errors
        super().__init__("; ".join(f"{k}: {' '.join(v)}" for k, v in sorted(errors.items())))


def _check_value(path: str, f: Any, value: Any, errors: dict[str, list[str]]) -> Any:
    """Coerce one JSON value to the field's type, or record why it cannot be."""
    meta = f.metadata
    default = f.default
    if value is None:
        if meta.get("optional"):
            return None
        errors.setdefault(path, []).append("This field is required.")
        return default
    kind = type(default) if default is not None else float
    if kind is bool:
        if not isinstance(value, bool):
            errors.setdefault(path, []).append(f"Must be true or false, got {value!r}.")
            return default
        return value
    if kind is str:
        if not isinstance(value, str):
            errors.setdefault(path, []).append(f"Must be a string, got {value!r}.")
            return default
        if len(value) > MAX_TEXT:
            errors.setdefault(path, []).append(f"Must be at most {MAX_TEXT} characters.")
            return default
        if "\x00" in value:
            errors.setdefault(path, []).append("Must not contain NUL characters.")
            return default
        if meta.get("choices") and value not in meta["choices"]:
            choices = ", ".join(meta["choices"])
            errors.setdefault(path, []).append(f"Must be one of {choices}, got {value!r}.")
            return default
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        errors.setdefault(path, []).append(f"Must be a number, got {value!r}.")
        return default
    if kind is int:
        if isinstance(value, float) and not value.is_integer():
            errors.setdefault(path, []).append(f"Must be a whole number, got {value!r}.")
            return default
        value = int(value)
    else:
        try:
            value = float(value)
        except OverflowError:  # a whole number too large for a float
            value = math.inf
        if not math.isfinite(value):
            errors.setdefault(path, []).append("Must be a finite number.")
            return default
    lo, hi = meta.get("lo"), meta.get("hi")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        errors.setdefault(path, []).append(
            f"Must be between {lo:g} and {hi:g}, got {_shown(value)}.")
        return default
    return value


def _shown(value: int | float) -> str:
    """A number for a message; a whole number too large for a float is shortened."""
    if isinstance(value, int) and abs(value) >= 10**16:
        digits = str(abs(value))
        return f"{'-' if value < 0 else ''}{digits[0]}.{digits[1:4]}e+{len(digits) - 1}"
    return f"{value:g}"


def _parse_section(prefix: str, cls: type, data: Any, errors: dict[str, list[str]]) -> Any:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        errors.setdefault(prefix, []).append("Must be an object.")
        data = {}
    known = {f.name: f for f in fields(cls)}
    for key in data:
        if key not in known:
            errors.setdefault(f"{prefix}.{key}", []).append("Unknown field.")
    values = {}
    for name, f in known.items():
        if name in data:
            values[name] = _check_value(f"{prefix}.{name}", f, data[name], errors)
        elif f.default is MISSING:
            values[name] = f.default_factory()
    return cls(**values)


def parse_config(data: Any, regions: list[str] | tuple[str, ...]) -> RunConfig:
    """Validate untrusted JSON into a RunConfig; missing fields take their defaults.

    Args:
        data: the config as decoded JSON (a dict), possibly partial.
        regions: the regions that have workers; every island must be in one.

    Raises:
        ConfigError: with every problem found, keyed by dotted path.
    """
    errors: dict[str, list[str]] = {}
    if not isinstance(data, dict):
        raise ConfigError({"config": ["Must be an object."]})
    top = {f.name: f for f in fields(RunConfig)}
    for key in data:
        if key not in top:
            errors.setdefault(key, []).append("Unknown field.")
    seed = _check_value("seed", top["seed"], data.get("seed", 0), errors)
    sections = {name: _parse_section(name, cls, data.get(name), errors)
                for name, cls in SECTIONS.items()}
    islands = _parse_islands(data.get("islands"), regions, errors)
    config = RunConfig(seed=seed, islands=islands, **sections)
    _check_relations(config, errors)
    if errors:
        raise ConfigError(errors)
    return config


def _parse_islands(data: Any, regions: list[str] | tuple[str, ...],
                   errors: dict[str, list[str]]) -> list[IslandConfig]:
    if data is None:
        data = [asdict(i) for i in default_islands()]
    if not isinstance(data, list) or not data:
        errors.setdefault("islands", []).append("Must be a list of at least one island.")
        return default_islands()
    if len(data) > MAX_ISLANDS:
        errors.setdefault("islands", []).append(f"At most {MAX_ISLANDS} islands, got {len(data)}.")
        return default_islands()
    islands = [_parse_section(f"islands.{i}", IslandConfig, item, errors)
               for i, item in enumerate(data)]
    seen: set[str] = set()
    for i, island in enumerate(islands):
        if not island.name.strip():
            errors.setdefault(f"islands.{i}.name", []).append("This field is required.")
        elif len(island.name) > MAX_ISLAND_NAME:
            errors.setdefault(f"islands.{i}.name", []).append(
                f"Must be at most {MAX_ISLAND_NAME} characters.")
        elif island.name in seen:
            errors.setdefault(f"islands.{i}.name", []).append(
                f"Island names must be unique; {island.name!r} is used twice.")
        seen.add(island.name)
        if island.batch_size % island.processes:
            errors.setdefault(f"islands.{i}.processes", []).append(
                f"Must divide islands.{i}.batch_size ({island.batch_size}), "
                f"got {island.processes}.")
        if island.region not in regions:
            errors.setdefault(f"islands.{i}.region", []).append(
                f"Must be one of the regions with workers ({', '.join(regions)}), "
                f"got {island.region!r}.")
    return islands


def _check_relations(config: RunConfig, errors: dict[str, list[str]]) -> None:
    """Rules that involve more than one field."""
    m = config.model
    if m.n_embd % m.n_head:
        errors.setdefault("model.n_head", []).append(
            f"Must divide model.n_embd ({m.n_embd}), got {m.n_head}.")
    params = parameter_count(m)
    if params > MAX_PARAMS:
        errors.setdefault("model", []).append(
            f"The model would have {params:,} parameters; at most {MAX_PARAMS:,} are allowed "
            "(fewer model.n_layer or a smaller model.n_embd).")
    s = config.sync
    n = len(config.islands)
    if not 1 <= s.min_quorum <= n:
        errors.setdefault("sync.min_quorum", []).append(
            f"Must be between 1 and the number of islands ({n}), got {s.min_quorum}.")
    tensors = len(tensor_sizes(m))
    if s.fragments > tensors:
        errors.setdefault("sync.fragments", []).append(
            f"Must be at most the number of the model's tensors (8 x model.n_layer + 5 = "
            f"{tensors}), got {s.fragments}.")
    if s.fragments > s.inner_steps:
        errors.setdefault("sync.fragments", []).append(
            f"Must be at most sync.inner_steps ({s.inner_steps}), got {s.fragments}.")
    if s.overlap_steps >= s.inner_steps:
        errors.setdefault("sync.overlap_steps", []).append(
            f"Must be less than sync.inner_steps ({s.inner_steps}), got {s.overlap_steps}.")
    if config.eval.tokens < m.block_size:
        errors.setdefault("eval.tokens", []).append(
            f"Must be at least model.block_size ({m.block_size}), got {config.eval.tokens}.")


def field_help() -> dict[str, str]:
    """Dotted path -> one-line help, for the form and the docs."""
    out = {"seed": fields(RunConfig)[0].metadata["help"]}
    for name, cls in {**SECTIONS, "islands[]": IslandConfig}.items():
        for f in fields(cls):
            out[f"{name}.{f.name}"] = f.metadata["help"]
    return out


def config_from_spec(spec: dict[str, Any]) -> RunConfig:
    """The run config of a run spec (the web app stores it with the run, and islands and
    syncd read it from Redis); it was validated when the run was made."""
    regions = sorted({i["region"] for i in spec["config"]["islands"]})
    return parse_config(spec["config"], regions)
