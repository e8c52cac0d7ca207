"""The records that cross layers, typed: what an island reports and what a run's status holds.

An island writes its `Heartbeat`; syncd reads it for liveness, status and recovery. syncd
builds a run's `RunStatus`; the web app's API schema, its Prometheus metrics and the run
page's field list are generated from it, so nothing is written out twice by hand.
"""

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
