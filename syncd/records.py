"""The records that cross layers, typed: what an island reports and what a run's status holds.

An island writes its `Heartbeat`; syncd reads it for liveness, status and recovery. syncd
builds a run's `RunStatus`; the web app's API schema, its Prometheus metrics and the run
page's field list are generated from it, so nothing is written out twice by hand.
"""

import dataclasses
import math
from types import NoneType, UnionType
from typing import (
    Annotated,
    Any,
    Literal,
    NotRequired,
    TypedDict,
    get_args,
    get_origin,
    get_type_hints,
    is_typeddict,
)

# -- an island's heartbeat: what trainer/runner.py writes every HEARTBEAT_S -----------
# Islands write the heartbeats hash, so syncd reads each as hostile input:
# `Heartbeat.from_dict` takes exactly the record's fields, each of its type and bounds.

MAX_COUNT = 2**53  # the largest whole number JSON's doubles hold exactly
MAX_PHASES = 16  # names in a heartbeat's phases (trainer/phases.py has 8)
MAX_NAME = 64  # characters of a phase's name


class HeartbeatError(ValueError):
    """A heartbeat that is not one; the message names the field."""


@dataclasses.dataclass(frozen=True)
class Heartbeat:
    """What an island says of itself (trainer/runner.py `ProcessIsland.heartbeat`):
    syncd reads it for liveness, status and recovery, the web app for the time of a
    run's last sign of life. Every count, size and time is a number from 0 to
    MAX_COUNT. An island writes every field (`dataclasses.asdict`); `bare` is one of
    a process that has done nothing else yet (tests, benchmarks)."""

    epoch: Annotated[int, "The island's epoch."]
    time: Annotated[float, "The island's clock when it beat (seconds since 1970)."]
    step: Annotated[int, "Inner steps the island took."]
    tokens: Annotated[int, "Tokens the island trained on."]
    state: Annotated[Literal["starting", "restarting", "waiting", "training", "stopped"],
                     "What it does: starting (up to its first step), restarting (elastic's "
                     "whole-job restart), waiting (for a merge, or backpressure), training "
                     "or stopped."]
    loss: Annotated[float | None, "Its latest training loss; None before its first step "
                                  "or while not finite."]
    bytes_up: Annotated[int, "Bytes of update messages its link delivered."]
    bytes_down: Annotated[int, "Bytes of global messages it pulled."]
    startup_s: Annotated[float | None, "Seconds from its launch to its first step; None "
                                       "before it (elastic's restart delay)."]
    pid: Annotated[int, "Its process's id on its host (0: no process)."]
    idle_rss: Annotated[int | None, "Its process's resident bytes after its imports, before "
                                    "the spec."]
    pulls: Annotated[int, "Merged fragments it pulled."]
    pull_s: Annotated[float, "Seconds reading, checking and mixing pulled fragments."]
    pull_link_s: Annotated[float, "Seconds of the pulls' transfers, the emulated link's "
                                  "hold included."]
    sends: Annotated[int, "Update messages its link delivered."]
    send_link_s: Annotated[float, "Seconds the sends took on the link, upload slot waits "
                                  "apart."]
    pull_wait_s: Annotated[float, "Seconds of the pulls on the training thread (mixes, "
                                  "blocking waits)."]
    late_globals: Annotated[int, "Merged fragments mixed after their tau overlap steps."]
    backpressure_wait_s: Annotated[float, "Seconds waited, in this epoch, before sends for "
                                          "syncd to merge its updates (backpressure)."]
    slot_wait_s: Annotated[float, "Seconds its link waited, in this epoch, for upload "
                                  "slots."]
    phases: Annotated[dict[str, float] | None, "Seconds per start-up phase "
                                               "(trainer/phases.py); None before its "
                                               "first step."]
    first_step_cpu_s: Annotated[float | None, "CPU seconds of its first step on the "
                                              "training thread."]
    warm: Annotated[bool, "This epoch is a claimed warm standby."]
    cpu_share: Annotated[float | None, "Its process's share of its host's CPU over its last "
                                       "2 s (trainer/cpu.py)."]

    @classmethod
    def bare(cls, epoch: int, time: float, step: int, tokens: int,
             state: str = "training", **given: Any) -> "Heartbeat":
        """A heartbeat of `step` and `tokens` whose other counts are 0 and whose other
        figures are not known yet, but those `given`."""
        nothing: dict[str, Any] = {"loss": None, "startup_s": None, "idle_rss": None,
                                   "phases": None, "first_step_cpu_s": None, "warm": False,
                                   "cpu_share": None}
        counts = {name: kind() for name, (kind, _) in fields(cls).items()
                  if kind in (int, float)}
        return cls(**{**counts, **nothing, "epoch": epoch, "time": time, "step": step,
                      "tokens": tokens, "state": state, **given})

    @classmethod
    def from_dict(cls, data: object) -> "Heartbeat":
        """The heartbeat `data` (an island's JSON, read as hostile) holds.

        Raises:
            HeartbeatError: not an object, a field missing or unknown, or a value not
                of its field's type and bounds; the message names the field.
        """
        if not isinstance(data, dict):
            raise HeartbeatError(f"a heartbeat is an object, not {_shown(data)}")
        kinds = {name: kind for name, (kind, _) in fields(cls).items()}
        if unknown := sorted(str(k) for k in data if k not in kinds):
            raise HeartbeatError(f"{_shown(unknown[0])}: not a field of a heartbeat")
        if missing := [name for name in kinds if name not in data]:
            raise HeartbeatError(f"{missing[0]}: missing")
        return cls(**{name: _checked(name, kind, data[name]) for name, kind in kinds.items()})


def _checked(name: str, kind: Any, value: object) -> Any:
    """`value` as field `name` of type `kind` takes it, or HeartbeatError."""
    if get_origin(kind) is UnionType:  # X | None
        if value is None:
            return None
        kind = next(arg for arg in get_args(kind) if arg is not NoneType)
    if kind is bool and isinstance(value, bool):
        return value
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if kind is int and number and isinstance(value, int) and 0 <= value <= MAX_COUNT:
        return value
    if kind is float and number and math.isfinite(value) and 0 <= value <= MAX_COUNT:
        return float(value)
    if get_origin(kind) is Literal and isinstance(value, str) and value in get_args(kind):
        return value
    if get_origin(kind) is dict and isinstance(value, dict) and len(value) <= MAX_PHASES:
        if bad := [key for key in value if not isinstance(key, str) or len(key) > MAX_NAME]:
            raise HeartbeatError(f"{name}: {_shown(bad[0])} is not a name of at most "
                                 f"{MAX_NAME} characters")
        return {key: _checked(f"{name}.{key}", float, item) for key, item in value.items()}
    raise HeartbeatError(f"{name}: must be {_wanted(kind)}, not {_shown(value)}")


def _wanted(kind: Any) -> str:
    """What a field of type `kind` takes, in words."""
    if kind is bool:
        return "true or false"
    if kind is int:
        return f"a whole number from 0 to {MAX_COUNT}"
    if kind is float:
        return f"a number from 0 to {MAX_COUNT}"
    if get_origin(kind) is Literal:
        return "one of " + ", ".join(get_args(kind))
    return f"an object of at most {MAX_PHASES} names, each a number from 0 to {MAX_COUNT}"


def _shown(value: object) -> str:
    """`value` for an error message: its repr, cut short."""
    shown = repr(value)
    return shown if len(shown) <= 40 else shown[:37] + "..."


# -- a run's status: what syncd/status.py builds every status interval ----------------
# Each field carries its help in Annotated; webapp/api/status_schema.py makes the API's
# schema and the Prometheus metrics' help from them, and the run page's script is
# checked against them (tests/webapp/dashboard/test_run_js.py).

ISLAND_STATES = "pending, starting, training, lost, rejoining or stopped"
ISLAND_FAULTS = "none, straggle, partition, degrade or corrupt"


class LinkStatus(TypedDict):
    """An island's WAN link to syncd (syncd.status.link)."""

    state: Annotated[Literal["up", "degraded", "partitioned", "down"],
                     "The island's WAN link to syncd, from its state and active fault."]
    bytes_up: Annotated[float, "Emulated bytes sent in the last status interval."]
    bytes_down: Annotated[float, "Emulated bytes received in it."]


class IslandStatus(TypedDict):
    """One island as syncd sees it: from its heartbeat, its updates and the accounting."""

    region: Annotated[str, "The region the island runs in."]
    epoch: Annotated[int, "Epoch; syncd refuses updates from an older one."]
    state: Annotated[str, f"The island's state: {ISLAND_STATES}."]
    fault: Annotated[str, f"The island's active fault: {ISLAND_FAULTS}."]
    heartbeat_age_s: Annotated[float | None, "Seconds since its last heartbeat."]
    tokens: Annotated[int, "Tokens the island trained on."]
    inner_steps: Annotated[int, "Inner steps the island took."]
    loss: Annotated[float | None, "The island's latest training loss."]
    bytes_up: Annotated[int, "Bytes the island sent."]
    bytes_down: Annotated[int, "Bytes the island received."]
    emulated_bytes_up: Annotated[float, "Bytes sent, as emulated (times "
                                        "emulation.bytes_scale)."]
    emulated_bytes_down: Annotated[float, "Bytes received, as emulated."]
    tokens_per_s: Annotated[float, "The island's recent throughput."]
    step_time_s: Annotated[float | None, "Wall seconds per inner step, over its last "
                                         "whole steps (a second of them at least)."]
    cpu_share: Annotated[float | None, "The island process's share of its host's CPU (1 = "
                                       "every core) over its last 2 s: one thread with a "
                                       "core of its own shows 1/cores; much less is a "
                                       "starved island."]
    backpressure_wait_s: Annotated[float, "Seconds the island has waited, in this epoch, "
                                          "before a send for syncd to merge its updates: "
                                          "it holds at most 2 of each fragment not merged "
                                          "(backpressure). Growing: syncd is not merging (a "
                                          "round short of its quorum, syncd away)."]
    slot_wait_s: Annotated[float, "Seconds the island's link has waited, in this epoch, "
                                  "for one of the run's upload slots (sync.upload_slots) "
                                  "before writing an update message; its tau overlap "
                                  "steps and send queue keep it training meanwhile."]
    version_lag: Annotated[int, "Newest version minus the base version of the island's "
                                "last update, over its fragments."]
    rejoin_warm: Annotated[bool, "Whether a rejoin now would start on a warm standby of "
                                 "the island's region."]
    rejections: Annotated[int, "Updates of the island syncd refused."]
    staleness: Annotated[dict[str, float], "The ages of its updates merged (versions "
                                           "behind when merged): the last, and p50, p95, "
                                           "max and count over its recent ones "
                                           "(diloco/staleness.py)."]
    goodput: Annotated[float | None, "Useful island-seconds / allocated island-seconds."]
    overcredited: Annotated[bool, "Credited more useful seconds than it was allocated: a "
                                  "bug in the figures, shown, not clipped."]
    link: Annotated[LinkStatus, "Its WAN link to syncd."]


class LastMerge(TypedDict, total=False):
    """A fragment's last merge; empty before its first."""

    version: Annotated[int, "The version the merge made."]
    weights: Annotated[dict[str, float], "Island -> its weight in the merge."]
    reason: Annotated[str, "Why the round closed."]


class FragmentStatus(TypedDict):
    """One fragment's round: its arrivals against its quorum, and its last merge."""

    index: Annotated[int, "The fragment's index."]
    name: Annotated[str, "The parameters it holds."]
    version: Annotated[int, "Its global version."]
    arrivals: Annotated[int, "Updates in its round now."]
    min_quorum: Annotated[int, "Updates its round needs to merge."]
    grace_left_s: Annotated[float | None, "Seconds of grace left once the quorum is in."]
    waiting: Annotated[str, "What the round waits for."]
    last_merge: Annotated[LastMerge, "Its last merge."]


class CorpusStatus(TypedDict):
    """The preparation of the run's corpus by syncd (syncd/corpus.py): its state and
    the counts of its pass under way (or its last)."""

    state: Annotated[Literal["waiting", "preparing", "ready", "failed"],
                     "waiting: not begun (a bytes run's begins at its first evaluation); "
                     "preparing; ready; failed (`error` says why)."]
    stage: Annotated[str, "The pass: training the tokenizer, tokenizing or copying; empty "
                          "where the prepared files were current."]
    bytes_read: Annotated[int, "Bytes of the corpus' files the pass has read."]
    bytes_total: Annotated[int, "Bytes of the corpus' files."]
    documents: Annotated[int, "Documents the pass has read."]
    skipped: Annotated[int, "Records the pass skipped (lines not JSON or without the text "
                            "field, empty rows, binary files)."]
    error: Annotated[str | None, "Why the preparation failed; None unless it did."]


def corpus_waiting() -> CorpusStatus:
    """A corpus whose preparation has not begun: no pass, no counts."""
    return CorpusStatus(state="waiting", stage="", bytes_read=0, bytes_total=0, documents=0,
                        skipped=0, error=None)


class RunStatus(TypedDict):
    """A run's status: per island and per fragment, and the run's figures
    (docs/FIGURES.md). syncd keeps the newest in Redis and pushes it to open pages."""

    run: Annotated[int | str, "The run's id."]
    time: Annotated[float, "syncd's clock when the status was taken (seconds since the "
                           "epoch)."]
    alive_islands: Annotated[int, "Islands syncd hears from."]
    goodput: Annotated[float | None, "Useful island-seconds / allocated island-seconds."]
    overcredited: Annotated[list[str], "Islands credited above their allocation."]
    uptime: Annotated[float | None, "Share of the time since start-up in which the global "
                                    "model advanced (docs/FIGURES.md)."]
    train_loss: Annotated[float | None, "The islands' recent training loss (their median)."]
    startup_s: Annotated[float | None, "Seconds from the run's start to its first merge; "
                                       "not counted as down time."]
    theta_s: Annotated[float | None, "Uptime's theta: a merge gap longer is down time."]
    max_stall_s: Annotated[float | None, "The longest gap between merges."]
    lost_s: Annotated[dict[str, float], "Island-seconds lost, by cause."]
    round_trip_s: Annotated[float, "t_sync of the grace window: a fragment's round trip "
                                   "(send plus pull) on a typical island's link."]
    round_trip_source: Annotated[Literal["measured", "configured"], "What sized "
                                 "round_trip_s: the islands' measured sends and pulls, or "
                                 "the config's bandwidth and latency until both are "
                                 "measured."]
    tau: Annotated[int, "The tau the islands use now (0: each waits for the merge of its "
                        "update): in mode decoupled syncd's choice from the run's pace "
                        "(sync.wait_share, diloco/overlap.py), else the config's."]
    wait_slowdown: Annotated[float | None, "How much waiting for each merge slowed the "
                                           "run's pace (tokens per second) against "
                                           "overlapping, as syncd last measured either way; "
                                           "None until both are measured, and where tau is "
                                           "not chosen."]
    versions: Annotated[list[int], "Global version per fragment."]
    outer_steps: Annotated[int, "The smallest fragment version."]
    tokens_merged: Annotated[int, "Tokens merged into the global model."]
    eval_loss: Annotated[float | None, "The global model's latest held-out loss (nats per "
                                       "token, on the config's validation split)."]
    eval_tokens: Annotated[int | None, "Tokens merged into the model `eval_loss` is of."]
    eval_bpb: Annotated[float | None, "`eval_loss` in bits per byte of the held-out text: "
                                      "eval_loss / ln 2 / bytes per token (1 for the bytes "
                                      "tokenizer), comparable across tokenizers."]
    staleness: Annotated[dict[str, float], "The ages of the updates merged, every "
                                           "island's together: p50, p95, max and count."]
    corpus: Annotated[CorpusStatus, "The preparation of the run's corpus by syncd."]
    islands: Annotated[dict[str, IslandStatus], "Island name -> its status."]
    fragments: Annotated[list[FragmentStatus], "Per fragment, its round."]
    outcome: NotRequired[Annotated[dict[str, Any], "The run's final figures, in its last "
                                                   "status only (syncd/outcome.py)."]]


def fields(record: type) -> dict[str, tuple[Any, str]]:
    """A record's fields: name -> (type, help), the type without its help (Annotated)
    and without NotRequired."""
    out = {}
    for name, hint in get_type_hints(record, include_extras=True).items():
        if get_origin(hint) is NotRequired:
            hint = get_args(hint)[0]
        kind, help_text = get_args(hint)[:2] if get_origin(hint) is Annotated else (hint, "")
        out[name] = (kind, help_text)
    return out


def field_paths(record: type, prefix: str = "") -> set[str]:
    """Every field a reader may read in a record, dotted, `*` for any key of a dict or
    item of a list: {"time", "islands", "islands.*", "islands.*.link.state", ...}."""
    paths = set()
    for name, (kind, _) in fields(record).items():
        path = f"{prefix}{name}"
        paths.add(path)
        while get_origin(kind) in (dict, list):
            kind = get_args(kind)[-1]
            path += ".*"
            paths.add(path)
        if is_typeddict(kind):
            paths |= field_paths(kind, f"{path}.")
    return paths
