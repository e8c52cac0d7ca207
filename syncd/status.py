"""The status snapshot of a run that syncd keeps in Redis for the control room.

A read-only view: `run_status` reads the parts of a RunSync and changes none.
"""

from __future__ import annotations

from collections.abc import Mapping
from statistics import median as _median
from typing import TYPE_CHECKING, Any

from diloco.uptime import fragment_cadence, uptime_theta

if TYPE_CHECKING:
    from diloco.accounting import RunAccounting
    from syncd.liveness import Liveness
    from syncd.rounds import Rounds
    from syncd.spec import RunSpec


def run_status(now: float, *, run_id: str, spec: RunSpec, rounds: Rounds, liveness: Liveness,
               accounting: RunAccounting, tokens_merged: int, eval_loss: float | None,
               eval_tokens: int | None, previous: dict[str, Any] | None = None,
               tick_s: float = 0.0,
               standbys: dict[str, int] | None = None) -> dict[str, Any]:
    """Per island state, active fault, tokens, tokens/s, seconds per inner step, its
    process's share of its host's CPU (from its heartbeat: trainer/cpu.py), the seconds
    it waited for syncd to merge before sending (`backpressure_wait_s`) and its link
    for an upload slot before writing an update (`slot_wait_s`), version lag, the ages
    of its updates merged (`staleness`: last, p50, p95, max; diloco/staleness.py), bytes
    (real and as emulated) and its WAN link to syncd (see `link`, against the
    `previous` status); per fragment arrivals/K, grace left and the last merge; the
    run's versions, goodput (with `overcredited`: the islands credited above their
    allocation, a bug shown, not clipped), uptime, train and eval loss (`eval_loss`, of
    the model with `eval_tokens` merged); and per island whether a rejoin now would
    start warm (`rejoin_warm`: a standby of its region is ready, `standbys` region ->
    ready, and the island is of one process). Uptime's theta (`theta`) is floored by a
    fragment's round trip and syncd's measured `tick_s`."""
    config, sync, alive = spec.config, rounds.sync, liveness.alive
    newest = max(sync.versions())
    scale = config.emulation.bytes_scale
    islands = {}
    for island in config.islands:
        beat = liveness.heartbeats.get(island.name, {})
        bases = [pending.contribution.base_version for p in range(len(rounds.fragments))
                 if (pending := sync.open_round(p).get(island.name)) is not None]
        islands[island.name] = {
            "region": island.region, "epoch": liveness.epochs.get(island.name, 0),
            "state": "lost" if island.name in liveness.lost else beat.get("state", "pending"),
            "heartbeat_age_s": round(now - beat["time"], 2) if beat else None,
            "tokens": beat.get("tokens", 0), "inner_steps": beat.get("step", 0),
            "loss": beat.get("loss"), "bytes_up": beat.get("bytes_up", 0),
            "bytes_down": beat.get("bytes_down", 0),
            "emulated_bytes_up": beat.get("bytes_up", 0) * scale,
            "emulated_bytes_down": beat.get("bytes_down", 0) * scale,
            "tokens_per_s": round(liveness.tokens_per_s.get(island.name, 0.0), 1),
            "step_time_s": _rounded(liveness.step_time_s.get(island.name), 4),
            "cpu_share": beat.get("cpu_share"),
            "backpressure_wait_s": beat.get("backpressure_wait_s", 0.0),
            "slot_wait_s": beat.get("slot_wait_s", 0.0),
            "version_lag": newest - min(bases) if bases else 0,
            "staleness": rounds.publisher.staleness.island(island.name),
            "rejoin_warm": island.processes == 1
            and (standbys or {}).get(island.region, 0) >= 1,
            "rejections": rounds.ingester.rejections[island.name]}
    fragments = []
    for p, f in enumerate(rounds.fragments):
        decision = rounds.decide(p, now, alive)
        fragments.append({"index": p, "name": f.name, "version": sync.version(p),
                          "arrivals": len(sync.open_round(p)),
                          "min_quorum": rounds.barrier_size(p, alive) if spec.barrier
                          else config.sync.min_quorum,
                          "grace_left_s": round(decision.deadline - now, 2)
                          if decision.deadline else None,
                          "waiting": decision.reason, "last_merge": rounds.publisher.last_merge[p]})
    figures = accounting.snapshot(now, theta(
        accounting, spec, pace=pace(spec, liveness.tokens_per_s),
        round_trip_s=rounds.round_stats().sync_time_s, tick_s=tick_s))
    for name, island_figures in figures["islands"].items():
        if name in islands:
            islands[name]["goodput"] = island_figures["goodput"]
            islands[name]["overcredited"] = island_figures["overcredited"]
            islands[name]["fault"] = liveness.faults.get(name, "none")
    before = (previous or {}).get("islands", {})
    for name, island in islands.items():
        island["link"] = link(island, before.get(name), unheard=name in liveness.unheard)
    return {"run": run_id, "time": now, "alive_islands": alive,
            "goodput": figures["goodput"], "overcredited": figures["overcredited"],
            "uptime": figures["uptime"],
            "train_loss": median([i["loss"] for i in islands.values()
                                  if i["loss"] is not None and i["state"] == "training"]),
            "startup_s": figures["startup_s"], "theta_s": figures["theta_s"],
            "max_stall_s": figures["max_stall_s"], "lost_s": figures["lost_s"],
            "versions": sync.versions(), "outer_steps": sync.outer_steps,
            "tokens_merged": tokens_merged, "eval_loss": eval_loss,
            "eval_tokens": eval_tokens, "staleness": rounds.publisher.staleness.run(),
            "islands": islands, "fragments": fragments}


def link_state(state: str, fault: str, unheard: bool = False) -> str:
    """The state of an island's WAN link to syncd: partitioned or degraded while that
    fault is active (a partitioned island also goes silent, then lost), partitioned too
    while the island is `unheard` (lost silent, no death reported: its link cut, as far
    as syncd can tell), down when no process speaks on it (lost, stopped, not started),
    else up."""
    if fault == "partition" or unheard:
        return "partitioned"
    if state in ("lost", "stopped", "pending"):
        return "down"
    return "degraded" if fault == "degrade" else "up"


def link(island: dict[str, Any], before: dict[str, Any] | None,
         unheard: bool = False) -> dict[str, Any]:
    """The island's link: its state (`link_state`), and the emulated bytes it carried
    each way since the status `before` (the island's entry in the previous status;
    None, as in the first status: nothing carried yet)."""
    carried = {}
    for way in ("up", "down"):
        total = island.get(f"emulated_bytes_{way}", 0)
        earlier = total if before is None else before.get(f"emulated_bytes_{way}", 0)
        # A new epoch counts its bytes from 0 again.
        carried[f"bytes_{way}"] = total - earlier if total >= earlier else total
    return {"state": link_state(island["state"], island.get("fault", "none"), unheard),
            **carried}


def pace(spec: RunSpec, tokens_per_s: Mapping[str, float]) -> dict[str, float]:
    """Each island's seconds per inner step now, from the tokens per second of its
    heartbeats (Liveness.tokens_per_s, over about a second): how fast it trains while
    a merge is awaited, which its updates tell only once they arrive."""
    config = spec.config
    return {i.name: i.batch_size * config.model.block_size / tokens_per_s[i.name]
            for i in config.islands if tokens_per_s.get(i.name, 0.0) > 0}


def theta(accounting: RunAccounting, spec: RunSpec, *,
          pace: Mapping[str, float] | None = None, round_trip_s: float = 0.0,
          tick_s: float = 0.0) -> float | None:
    """Uptime's theta: twice a fragment's cadence, H steps at the step time of the K-th
    fastest island (elastic: the slowest, the barrier waits for every island), at the
    fault-free step times or, when the islands go slower now, at their `pace` (each
    one's seconds per step now, `pace`): a slowdown is not a stall.
    Never less than twice a fragment's `round_trip_s` and syncd's `tick_s`
    (uptime_theta); None before any fault-free step time is known."""
    config = spec.config
    k = len(config.islands) if spec.barrier else config.sync.min_quorum
    cadence = accounting.cadence(config.sync.inner_steps, k)
    if cadence is None:
        return None
    now = fragment_cadence([(pace or {}).get(i.name) for i in config.islands],
                           config.sync.inner_steps, min(k, len(config.islands)))
    return uptime_theta(max(cadence, now or 0.0), round_trip_s=round_trip_s, tick_s=tick_s)


def _rounded(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def median(values: list[float]) -> float | None:
    return _median(values) if values else None
