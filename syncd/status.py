"""The status snapshot of a run that syncd keeps in Redis for the control room.

A read-only view: `run_status` reads the parts of a RunSync and changes none.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from statistics import median as _median
from typing import TYPE_CHECKING, Any

from diloco.uptime import fragment_cadence, uptime_theta
from syncd.records import (
    CorpusStatus,
    FragmentStatus,
    IslandStatus,
    LinkStatus,
    RunStatus,
    corpus_waiting,
)

if TYPE_CHECKING:
    from diloco.accounting import RunAccounting
    from diloco.config import IslandConfig
    from syncd.liveness import Liveness
    from syncd.rounds import Rounds
    from syncd.spec import RunSpec


@dataclass(frozen=True)
class StatusSources:
    """What a run's status is read from: the parts of its RunSync, and what its service
    keeps beside them: the eval loss of the model with `eval_tokens` merged (and in bits
    per byte, `eval_bpb`), syncd's measured `tick_s`, the islands' `tau` and what
    waiting costs the run's pace (`wait_slowdown`, syncd/waiting.py), `standbys` (region -> warm
    standbys ready) and the preparation of the run's `corpus`."""

    run_id: int | str
    spec: RunSpec
    rounds: Rounds
    liveness: Liveness
    accounting: RunAccounting
    eval_loss: float | None = None
    eval_tokens: int | None = None
    eval_bpb: float | None = None
    tick_s: float = 0.0
    tau: int = 0
    wait_slowdown: float | None = None
    standbys: Mapping[str, int] = field(default_factory=dict)
    corpus: CorpusStatus = field(default_factory=corpus_waiting)


def run_status(now: float, sources: StatusSources,
               previous: RunStatus | None = None) -> RunStatus:
    """The run's status at `now` (syncd.records.RunStatus says what each field is): per
    island (island_status), per fragment (fragment_status), and the run's figures from
    its accounting, goodput with `overcredited` (the islands credited above their
    allocation, a bug shown, not clipped), and t_sync, the round trip that sizes the
    grace window, with its source (measured or configured: Rounds.sync_time).
    Uptime's theta (`theta`) is floored by that round trip and syncd's measured
    `tick_s`; each island's link counts its bytes against the `previous` status."""
    spec, rounds, accounting = sources.spec, sources.rounds, sources.accounting
    sync = rounds.sync_time()
    figures = accounting.snapshot(now, theta(
        accounting, spec, pace=pace(spec, sources.liveness.tokens_per_s),
        round_trip_s=sync.seconds, tick_s=sources.tick_s))
    before = (previous or {}).get("islands", {})
    islands = {i.name: island_status(now, sources, i, figures["islands"].get(i.name, {}),
                                     before.get(i.name))
               for i in spec.config.islands}
    return RunStatus(
        run=sources.run_id, time=now, alive_islands=sources.liveness.alive,
        goodput=figures["goodput"], overcredited=figures["overcredited"],
        uptime=figures["uptime"],
        train_loss=median([i["loss"] for i in islands.values()
                           if i["loss"] is not None and i["state"] == "training"]),
        startup_s=figures["startup_s"], theta_s=figures["theta_s"],
        max_stall_s=figures["max_stall_s"], lost_s=figures["lost_s"],
        round_trip_s=round(sync.seconds, 4), round_trip_source=sync.source,
        tau=sources.tau, wait_slowdown=_rounded(sources.wait_slowdown, 4),
        versions=rounds.sync.versions(), outer_steps=rounds.sync.outer_steps,
        tokens_merged=rounds.tokens_merged(), eval_loss=sources.eval_loss,
        eval_tokens=sources.eval_tokens, eval_bpb=sources.eval_bpb,
        staleness=rounds.publisher.staleness.run(), corpus=sources.corpus, islands=islands,
        fragments=[fragment_status(now, sources, p) for p in range(len(rounds.fragments))])


def island_status(now: float, sources: StatusSources, island: IslandConfig,
                  figures: Mapping[str, Any], before: IslandStatus | None) -> IslandStatus:
    """One island: from its heartbeat (tokens, steps, loss, bytes real and as emulated,
    its process's share of its host's CPU: trainer/cpu.py, its backpressure and upload
    slot waits), from syncd's watch over it (state, fault, tokens/s, step time), its
    version lag over its updates in the rounds, the ages of its updates merged
    (diloco/staleness.py), its accounting `figures` (goodput), and
    whether a rejoin now would start warm (a standby of its region is ready and the
    island is of one process)."""
    liveness, sync, name = sources.liveness, sources.rounds.sync, island.name
    beat = liveness.heartbeats.get(name)
    bases = [pending.contribution.base_version for p in range(len(sources.rounds.fragments))
             if (pending := sync.open_round(p).get(name)) is not None]
    scale = sources.spec.config.emulation.bytes_scale
    up, down = (beat.bytes_up, beat.bytes_down) if beat else (0, 0)
    state = "lost" if name in liveness.lost else beat.state if beat else "pending"
    fault = liveness.faults.get(name, "none")
    return IslandStatus(
        region=island.region, epoch=liveness.epochs.get(name, 0), state=state, fault=fault,
        heartbeat_age_s=round(now - beat.time, 2) if beat else None,
        tokens=beat.tokens if beat else 0, inner_steps=beat.step if beat else 0,
        loss=beat.loss if beat else None, bytes_up=up, bytes_down=down,
        emulated_bytes_up=up * scale, emulated_bytes_down=down * scale,
        tokens_per_s=round(liveness.tokens_per_s.get(name, 0.0), 1),
        step_time_s=_rounded(liveness.step_time_s.get(name), 4),
        cpu_share=beat.cpu_share if beat else None,
        backpressure_wait_s=beat.backpressure_wait_s if beat else 0.0,
        slot_wait_s=beat.slot_wait_s if beat else 0.0,
        version_lag=max(sync.versions()) - min(bases) if bases else 0,
        rejoin_warm=island.processes == 1 and sources.standbys.get(island.region, 0) >= 1,
        rejections=sources.rounds.ingester.rejections[name],
        staleness=sources.rounds.publisher.staleness.island(name),
        goodput=figures.get("goodput"), overcredited=figures.get("overcredited", False),
        link=link({"state": state, "fault": fault, "emulated_bytes_up": up * scale,
                   "emulated_bytes_down": down * scale}, before,
                  unheard=name in liveness.unheard))


def fragment_status(now: float, sources: StatusSources, p: int) -> FragmentStatus:
    """Fragment p's round: its arrivals against its quorum (a barrier run: over the
    alive islands), the grace left and what it waits for, and its last merge."""
    rounds, alive = sources.rounds, sources.liveness.alive
    decision = rounds.decide(p, now, alive)
    return FragmentStatus(
        index=p, name=rounds.fragments[p].name, version=rounds.sync.version(p),
        arrivals=len(rounds.sync.open_round(p)),
        min_quorum=rounds.barrier_size(p, alive) if sources.spec.barrier
        else sources.spec.config.sync.min_quorum,
        grace_left_s=round(decision.deadline - now, 2) if decision.deadline else None,
        waiting=decision.reason, last_merge=rounds.publisher.last_merge[p])


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


def link(island: Mapping[str, Any], before: Mapping[str, Any] | None,
         unheard: bool = False) -> LinkStatus:
    """The island's link: its state (`link_state`), and the emulated bytes it carried
    each way since the status `before` (the island's entry in the previous status;
    None, as in the first status: nothing carried yet)."""
    carried = {}
    for way in ("up", "down"):
        total = island.get(f"emulated_bytes_{way}", 0)
        earlier = total if before is None else before.get(f"emulated_bytes_{way}", 0)
        # A new epoch counts its bytes from 0 again.
        carried[f"bytes_{way}"] = total - earlier if total >= earlier else total
    return LinkStatus(state=link_state(island["state"], island.get("fault", "none"), unheard),
                      **carried)


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
