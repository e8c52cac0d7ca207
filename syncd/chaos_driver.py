"""syncd carries out a run's chaos schedule (`config.chaos`): it has the clock and the store.

The schedule (diloco/chaos.py) says at which second which islands break, how and
for how long. `ChaosPlan` turns it into actions in time order: each fault's
start and, for kills and region outages, its end, which is a rejoin. It is pure:
the caller passes the seconds since the schedule's start and how many actions
are already done. `ChaosDriver` applies the due ones to an active run through the
paths the control room's buttons use:

- kill, region outage: a "kill" command in the island's control list, carried
  out by its supervisor on the island's own host (SIGKILL mid-step); a kill's
  supervisor reports the death at once, a region outage's holds it back (a region
  that has gone dark tells no one), so syncd learns it by the heartbeat timeout;
- straggle, partition, degrade, corrupt: the island's fault key
  `arch:R:fault:<island>` ({kind, until, factor}), which the island process reads
  and acts out;
- the end of a kill: the web side's rejoin (syncd.hooks.Hooks.rejoin, which is
  `webapp.runs.membership.rejoin_island`): the island's next epoch (next
  epoch, a warm standby or a task on its region's queue).

Each fault is a "fault" event (no actor: the system) whose detail carries the
schedule ({"preset", "seed", "at_s"}); the rejoin records its own "rejoin"
event. The schedule's clock starts when every island of the run has trained
(their start-up is the same in every mode, and a kill of a process that is not
there yet would mean nothing), or START_AFTER_S after syncd took the run,
whichever comes first. The start, the islands and the number of actions done
are kept in Redis (`arch:R:chaos`), so a restarted syncd goes on with the next
action instead of starting the schedule over.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from diloco.chaos import PRESETS, Fault, schedule

if TYPE_CHECKING:
    from syncd.hooks import Recorder
    from syncd.liveness import Liveness
    from syncd.spec import RunSpec
    from syncd.store import RunStore

log = logging.getLogger("archipelago.syncd")
START_AFTER_S = 120.0
# The schedule is drawn this far ahead, then again twice as far (the same seed draws the
# same faults first, so a longer schedule begins with the shorter one).
HORIZON_S = 3600.0
# The factor a fault takes when the schedule gives none (webapp/runs/faults.py's defaults).
DEFAULT_FACTOR = {"straggle": 4.0, "degrade": 10.0, "partition": 1.0, "corrupt": 1.0}


@dataclass(frozen=True)
class Action:
    """One thing to do at `at_s` seconds into the schedule: a fault's start or its rejoin."""

    at_s: float
    kind: str  # "fault" or "rejoin"
    fault: Fault


def actions_of(faults: list[Fault]) -> list[Action]:
    """Every fault's start and, when it ends in a rejoin, its end, in time order.

    At the same instant a rejoin comes before a new fault, and ties are broken by the
    islands' names, so the order never depends on how the list was built.
    """
    out = [Action(f.at_s, "fault", f) for f in faults]
    out += [Action(f.ends_s, "rejoin", f) for f in faults if f.rejoin]
    return sorted(out, key=lambda a: (a.at_s, a.kind != "rejoin", a.fault.islands))


class ChaosPlan:
    """Which actions of a seeded schedule are due.

    Args:
        preset: a name in diloco.chaos.PRESETS.
        islands: island name -> region, the islands the schedule may break.
        seed: seeds the schedule.
        horizon_s: how far ahead the schedule is drawn at first.
    """

    def __init__(self, preset: str, islands: dict[str, str], seed: int,
                 horizon_s: float = HORIZON_S):
        if preset not in PRESETS:
            raise ValueError(f"unknown chaos preset {preset!r}; known: {', '.join(PRESETS)}")
        if not horizon_s > 0:
            raise ValueError(f"horizon_s must be positive, got {horizon_s}")
        self.preset = PRESETS[preset]
        self.islands = dict(islands)
        self.seed = seed
        self.horizon_s = horizon_s
        self.actions = actions_of(schedule(self.preset, self.islands, horizon_s, seed))

    def due(self, elapsed_s: float, done: int) -> list[Action]:
        """The actions after the first `done` whose time has come at `elapsed_s`."""
        if done < 0:
            raise ValueError(f"done must be 0 or more, got {done}")
        while elapsed_s >= self.horizon_s / 2:
            # Every action before the old horizon is the same in the longer schedule.
            self.horizon_s *= 2
            self.actions = actions_of(schedule(self.preset, self.islands, self.horizon_s,
                                               self.seed))
        due = []
        for action in self.actions[done:]:
            if action.at_s > elapsed_s:
                break
            due.append(action)
        return due


class ChaosDriver:
    """Applies a run's chaos schedule from syncd's loop (RunSync calls `tick`).

    Args:
        store: the run's Redis keys (commands, fault keys, the schedule's progress).
        recorder: the run's rows (fault events).
        spec: the run's spec; its config names the preset and the seed.
        rejoin: starts the next epoch of (run id, island); None in a syncd
            started without one.
        since: when syncd took the run: the schedule's clock starts START_AFTER_S
            later at the latest.
    """

    def __init__(self, store: RunStore, recorder: Recorder, spec: RunSpec,
                 rejoin: Callable[[int, str], None] | None, since: float):
        self.store = store
        self.recorder = recorder
        self.spec = spec
        self.rejoin = rejoin
        self.since = since
        chaos = spec.config.chaos
        self.preset, self.seed = chaos.preset, chaos.seed
        saved = store.control.chaos_progress()
        self.start: float | None = float(saved["start"]) if "start" in saved else None
        self.done = int(saved.get("done", 0))
        islands = json.loads(saved["islands"]) if "islands" in saved else None
        self.plan = None if islands is None else ChaosPlan(self.preset, islands, self.seed)

    @classmethod
    def for_run(cls, store: RunStore, recorder: Recorder, spec: RunSpec,
                rejoin: Callable[[int, str], None] | None, since: float) -> ChaosDriver | None:
        """The driver of a run that asks for a schedule, else None."""
        if spec.config.chaos.preset == "none":
            return None
        return cls(store, recorder, spec, rejoin, since)

    def tick(self, now: float, liveness: Liveness) -> None:
        """Start the schedule's clock when it is time (`liveness` says whether every
        island trains), then apply every due action."""
        if self.start is None:
            islands = {i.name: i.region for i in self.spec.config.islands}
            everyone = liveness.alive >= len(islands) and all(
                (beat := liveness.heartbeats.get(n)) and beat.state == "training" for n in islands)
            if not everyone and now - self.since < START_AFTER_S:
                return
            self.start = now
            self.plan = ChaosPlan(self.preset, islands, self.seed)
            self.store.control.start_chaos(now, islands)
            log.info("run %s: chaos schedule %s (seed %d) starts", self.store.run_id,
                     self.preset, self.seed)
        assert self.plan is not None
        for action in self.plan.due(now - self.start, self.done):
            try:
                if action.kind == "rejoin":
                    self._rejoin(action)
                else:
                    self._fault(action, now, liveness.epochs)
            except Exception:  # one action that fails must not stop the schedule or merging
                log.exception("run %s: chaos action %s failed", self.store.run_id, action)
            self.done += 1
            self.store.control.set_chaos_done(self.done)

    def _detail(self, action: Action) -> dict:
        return {"chaos": {"preset": self.preset, "seed": self.seed, "at_s": action.at_s}}

    def _fault(self, action: Action, now: float, epochs: dict[str, int]) -> None:
        fault = action.fault
        known = {i.name: i.region for i in self.spec.config.islands}
        for island in fault.islands:
            if island not in known:
                continue  # removed from the run since the schedule was drawn
            epoch = epochs.get(island, 0)
            detail = {"seconds": fault.duration_s, "epoch": epoch,
                      **self._detail(action)}
            if fault.kind in ("kill", "region_outage"):
                # A region that has gone dark tells no one: its supervisors hold the
                # death back, and syncd finds out by the heartbeat timeout.
                self.store.signals.send_command(island, "kill", epoch=epoch,
                                                report=fault.kind == "kill")
                if fault.kind == "region_outage":
                    detail["region"] = known[island]
                self.recorder.event("fault", island, fault="kill", **detail)
                continue
            factor = fault.factor if fault.factor is not None else DEFAULT_FACTOR[fault.kind]
            until = now + fault.duration_s
            self.store.signals.set_fault(island, fault.kind, until, factor, fault.duration_s)
            self.recorder.event("fault", island, fault=fault.kind, factor=factor, until=until,
                                **detail)

    def _rejoin(self, action: Action) -> None:
        if self.rejoin is None:
            raise RuntimeError("this syncd was started without a way to rejoin islands")
        known = self.spec.island_names()
        for island in action.fault.islands:
            if island in known:
                self.rejoin(int(self.store.run_id), island)
