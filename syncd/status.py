"""The status snapshot of a run that syncd keeps in Redis for the control room."""

from __future__ import annotations

from statistics import median as _median
from typing import TYPE_CHECKING, Any

from diloco.accounting import uptime_theta

if TYPE_CHECKING:
    from syncd.service import RunSync


def run_status(run: RunSync, now: float, live: int,
               previous: dict[str, Any] | None = None) -> dict[str, Any]:
    """Per island state, active fault, tokens, tokens/s, version lag, bytes (real and
    as emulated) and its WAN link to syncd (see `link`, against the `previous` status);
    per fragment arrivals/K, grace left and the last merge; the run's versions,
    goodput, uptime, train and eval loss."""
    newest = max(run.sync.versions)
    scale = run.config.emulation.bytes_scale
    islands = {}
    for island in run.config.islands:
        beat = run.heartbeats.get(island.name, {})
        bases = [run.sync.rounds[p][island.name].update.base_version
                 for p in range(len(run.fragments)) if island.name in run.sync.rounds[p]]
        islands[island.name] = {
            "region": island.region, "epoch": run.epochs.get(island.name, 0),
            "state": "lost" if island.name in run.lost else beat.get("state", "pending"),
            "heartbeat_age_s": round(now - beat["time"], 2) if beat else None,
            "tokens": beat.get("tokens", 0), "inner_steps": beat.get("step", 0),
            "loss": beat.get("loss"), "bytes_up": beat.get("bytes_up", 0),
            "bytes_down": beat.get("bytes_down", 0),
            "emulated_bytes_up": beat.get("bytes_up", 0) * scale,
            "emulated_bytes_down": beat.get("bytes_down", 0) * scale,
            "tokens_per_s": round(run.tokens_per_s.get(island.name, 0.0), 1),
            "version_lag": newest - min(bases) if bases else 0,
            "rejections": run.rejections[island.name]}
    fragments = []
    for p, f in enumerate(run.fragments):
        decision = run.decide(p, now, live)
        fragments.append({"index": p, "name": f.name, "version": run.sync.versions[p],
                          "arrivals": len(run.sync.rounds[p]),
                          "min_quorum": run.barrier_size(p, live) if run.elastic
                          else run.config.sync.min_quorum,
                          "grace_left_s": round(decision.deadline - now, 2)
                          if decision.deadline else None,
                          "waiting": decision.reason, "last_merge": run.last_merge[p]})
    accounting = run.accounting.snapshot(now, theta(run))
    for name, figures in accounting["islands"].items():
        if name in islands:
            islands[name]["goodput"] = figures["goodput"]
            islands[name]["fault"] = run.faults.get(name, "none")
    before = (previous or {}).get("islands", {})
    for name, island in islands.items():
        island["link"] = link(island, before.get(name))
    return {"run": run.store.run_id, "time": now, "live_islands": live,
            "goodput": accounting["goodput"], "uptime": accounting["uptime"],
            "train_loss": median([i["loss"] for i in islands.values()
                                  if i["loss"] is not None and i["state"] == "training"]),
            "startup_s": accounting["startup_s"], "theta_s": accounting["theta_s"],
            "max_stall_s": accounting["max_stall_s"], "lost_s": accounting["lost_s"],
            "versions": list(run.sync.versions), "outer_steps": run.sync.outer_steps,
            "tokens_merged": run.tokens_merged(), "eval_loss": run.eval_loss,
            "eval_tokens": run.eval_tokens,
            "islands": islands, "fragments": fragments}


def link_state(state: str, fault: str) -> str:
    """The state of an island's WAN link to syncd: partitioned or degraded while that
    fault is active (a partitioned island also goes silent, then lost), down when no
    process speaks on it (lost, stopped, not started), else up."""
    if fault == "partition":
        return "partitioned"
    if state in ("lost", "stopped", "pending"):
        return "down"
    return "degraded" if fault == "degrade" else "up"


def link(island: dict[str, Any], before: dict[str, Any] | None) -> dict[str, Any]:
    """The island's link: its state, and the emulated bytes it carried each way since
    the status `before` (the island's entry in the previous status; None, as in the
    first status: nothing carried yet)."""
    carried = {}
    for way in ("up", "down"):
        total = island.get(f"emulated_bytes_{way}", 0)
        earlier = total if before is None else before.get(f"emulated_bytes_{way}", 0)
        # A new incarnation counts its bytes from 0 again.
        carried[f"bytes_{way}"] = total - earlier if total >= earlier else total
    return {"state": link_state(island["state"], island.get("fault", "none")), **carried}


def theta(run: RunSync) -> float | None:
    """Uptime's theta: twice a fragment's cadence, H steps at the step time of the K-th
    fastest island (elastic: the slowest, the barrier waits for every island)."""
    k = len(run.config.islands) if run.elastic else run.config.sync.min_quorum
    cadence = run.accounting.cadence(run.config.sync.inner_steps, k)
    return None if cadence is None else uptime_theta(cadence)


def median(values: list[float]) -> float | None:
    return _median(values) if values else None
