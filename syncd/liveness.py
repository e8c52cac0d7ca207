"""syncd's watch over a run's islands, from their heartbeats and their supervisors'
death reports: lost and revived, rejoins, tokens per second, and when each was held
up by a fault (the step times that may value useful steps).

An island is lost as soon as its supervisor reports the death of its current
incarnation (RunStore.report_death), and otherwise after `heartbeat_timeout_s` of
silence: the timeout remains for hosts that vanish or are cut off (a region
outage, a partition), which tell no one.

Functions of a RunSync, called from its watch a few times a second.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from syncd import recovery

if TYPE_CHECKING:
    from syncd.service import RunSync

RATE_WINDOW_S = 1.0


def condition(beat: dict[str, Any] | None, death: dict[str, Any] | None, epoch: int,
              now: float, timeout: float) -> str:
    """What syncd knows of one island at `now`, from its last heartbeat, its last
    reported death and its current epoch (plain values):

    - "dead": its supervisor reported the death of the current incarnation (and no
      newer one has spoken since);
    - "alive": the current incarnation heartbeats, and it has not stopped;
    - "silent": the current incarnation was heard, but not for `timeout` seconds;
    - "stopped", or "unknown" while the current incarnation has not spoken yet.
    """
    spoke = beat["epoch"] if beat is not None else -1
    if death is not None and death["epoch"] >= max(epoch, spoke):
        return "dead"
    if beat is None or spoke < epoch:
        return "unknown"
    if now - beat["time"] > timeout:
        return "silent"
    return "stopped" if beat.get("state") == "stopped" else "alive"


def watch_islands(run: RunSync, now: float) -> int:
    """Mark islands lost or revived from their heartbeats and death reports; returns
    how many are alive. Not called while the run is paused: a paused island is
    silent on purpose."""
    timeout = run.config.liveness.heartbeat_timeout_s
    rejoins = run.store.rejoin_requests()
    deaths = getattr(run, "deaths", {})
    alive = 0
    for island in run.config.islands:
        beat = run.heartbeats.get(island.name)
        death = deaths.get(island.name)
        state = condition(beat, death, run.epochs.get(island.name, 0), now, timeout)
        if state == "alive":
            alive += 1
            asked = rejoins.get(island.name)
            if asked is not None and beat.get("state") == "training" \
                    and beat["epoch"] == run.epochs.get(island.name):
                run.store.close_rejoin_request(island.name)
                # With where the seconds went (trainer/phases.py) and whether a warm
                # standby took it.
                run.recorder.event("rejoin", island.name, epoch=beat["epoch"],
                                   seconds_to_first_step=round(beat["time"] - asked, 3),
                                   phases=beat.get("phases") or {},
                                   warm=bool(beat.get("warm")))
            if island.name in run.lost:
                run.lost.discard(island.name)
                run.recorder.event("island_revived", island.name, epoch=beat["epoch"])
                if run.elastic:
                    recovery.restart_job(run, now, island.name, joining=True)
            run.recorder.island(island.name, state="training", tokens=beat["tokens"],
                                inner_steps=beat["step"])
            track_rate(run, island.name, beat)
        elif state in ("dead", "silent") and island.name not in run.lost:
            run.lost.add(island.name)
            if state == "dead":
                run.recorder.event("island_lost", island.name, cause="died",
                                   epoch=death["epoch"], exit_code=death.get("exit_code"),
                                   signal=death.get("signal"),
                                   reported_after_s=round(max(now - death["time"], 0.0), 3))
            else:
                run.recorder.event("island_lost", island.name, cause="silent",
                                   silent_s=round(now - beat["time"], 1))
            run.recorder.island(island.name, state="lost")
            if run.elastic:
                recovery.restart_job(run, now, island.name)
    k = run.config.sync.min_quorum
    if alive < k and not run.waiting_alert and run.heartbeats:
        run.recorder.event("alert", None, message=f"waiting: {alive} of the {k} islands "
                           f"needed for a merge are alive")
    run.waiting_alert = alive < k
    return alive


def track_rate(run: RunSync, island: str, beat: dict[str, Any]) -> None:
    """Tokens per second of an island, over at least RATE_WINDOW_S of its heartbeats."""
    mark = run.rate_marks.get(island)
    if mark is None or beat["tokens"] < mark[1]:
        run.rate_marks[island] = (beat["time"], beat["tokens"])
    elif beat["time"] - mark[0] >= RATE_WINDOW_S:
        run.tokens_per_s[island] = (beat["tokens"] - mark[1]) / (beat["time"] - mark[0])
        run.rate_marks[island] = (beat["time"], beat["tokens"])


def note_disturbed(run: RunSync, now: float) -> None:
    """Islands faulted or lost at `now` were held up; so was the whole run, behind a
    barrier (never earlier than the end of a restart's pause, which restart_job set)."""
    disturbed = [*run.faults, *run.lost]
    for island in disturbed:
        run.disturbed[island] = now
    if disturbed:
        run.disturbed[""] = max(run.disturbed.get("", now), now)


def disturbed_since(run: RunSync, island: str, since: float) -> bool:
    """Whether `island` was faulted or lost since `since`; in elastic, whether any
    island was or the job restarted, since the barrier holds every island up."""
    last = run.disturbed.get(island, -math.inf)
    if run.elastic:
        last = max(last, run.disturbed.get("", -math.inf))
    return island in run.faults or last >= since
