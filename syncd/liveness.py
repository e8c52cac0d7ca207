"""syncd's watch over a run's islands, from their heartbeats and their supervisors'
death reports: lost and revived, rejoins, tokens per second, and when each was held
up by a fault or a user's pause (the step times that may value useful steps).

An island is lost as soon as its supervisor reports the death of its current
epoch (IslandSignals.report_death), and otherwise after `heartbeat_timeout_s` of
silence: the timeout remains for hosts that vanish or are cut off (a region
outage, a partition), which tell no one.

`Liveness` owns what syncd knows of the islands: their heartbeats, epochs, deaths
and faults, which are lost, how many are alive, their rates and when each was
last held up. RunSync feeds it the epochs on every pass and calls its watch a
few times a second.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from syncd.hooks import Recorder
    from syncd.records import Heartbeat
    from syncd.spec import RunSpec
    from syncd.store import RunStore

RATE_WINDOW_S = 1.0


def condition(beat: Heartbeat | None, death: dict[str, Any] | None, epoch: int,
              now: float, timeout: float) -> str:
    """What syncd knows of one island at `now`, from its last heartbeat, its last
    reported death and its current epoch (plain values):

    - "dead": its supervisor reported the death of the current epoch (and no
      newer one has spoken since);
    - "alive": the current epoch heartbeats, and it has not stopped;
    - "silent": the current epoch was heard, but not for `timeout` seconds;
    - "stopped", or "unknown" while the current epoch has not spoken yet.
    """
    spoke = beat.epoch if beat is not None else -1
    if death is not None and death["epoch"] >= max(epoch, spoke):
        return "dead"
    if beat is None or spoke < epoch:
        return "unknown"
    if now - beat.time > timeout:
        return "silent"
    return "stopped" if beat.state == "stopped" else "alive"


class Liveness:
    """The islands of one run as syncd sees them.

    Args:
        store: the run's Redis keys.
        recorder: the run's rows (lost, revived, rejoin and alert events).
        spec: the run's spec, whose islands and timeout are watched.
    """

    def __init__(self, store: RunStore, recorder: Recorder, spec: RunSpec):
        self.store = store
        self.recorder = recorder
        self.spec = spec
        self.heartbeats: dict[str, Heartbeat] = {}
        self.epochs: dict[str, int] = {}
        self.deaths: dict[str, dict[str, Any]] = {}  # island -> its supervisor's report
        self.faults: dict[str, str] = {}  # island -> the kind of its active fault
        self.lost: set[str] = set()
        # Of the lost, those silent with no death reported: cut off, as far as syncd can
        # tell (a link down, a region gone dark), its link shown partitioned.
        self.unheard: set[str] = set()
        self.alive = 0  # islands alive at the last watch; 0 while the run is paused
        self.sending: frozenset[str] = frozenset()  # of them, those past their start
        self.waiting_alert = False
        self.rate_marks: dict[str, tuple[float, int, int]] = {}  # island -> (time, tokens, step)
        self.step_marks: dict[str, tuple[float, int]] = {}  # island -> (time, step)
        self.tokens_per_s: dict[str, float] = {}
        self.step_time_s: dict[str, float] = {}  # island -> wall seconds per inner step
        # island ("" for the whole run) -> the last time it was seen faulted, lost or,
        # for the run, restarting: step times spanning it are not fault-free.
        self.disturbed: dict[str, float] = {}

    def follow_epochs(self, epochs: dict[str, int],
                            deaths: dict[str, dict[str, Any]]) -> bool:
        """Take the epochs and death reports read this pass (every pass: epochs fence
        off old epochs before their updates count); True if the death reports
        changed, so that the watch marks their islands lost on this very pass."""
        self.epochs = epochs
        if deaths == self.deaths:
            return False
        self.deaths = deaths
        return True

    def read(self) -> None:
        """Read the islands' heartbeats and active faults."""
        self.heartbeats = self.store.signals.heartbeats()
        self.faults = self.store.signals.faults([i.name for i in self.spec.config.islands])

    def watch(self, now: float, paused: bool,
              membership_changed: Callable[[str, float, bool], None]) -> None:
        """Mark islands lost or revived from their heartbeats and death reports (not
        while the run is paused: a paused island is silent on purpose), and note who
        was held up. `membership_changed(island, now, joining)` is called as each is
        lost or comes back, before the next island is looked at."""
        self.alive, self.sending = 0, frozenset()
        if not paused:
            self.alive = self._watch_islands(now, membership_changed)
        self._note_disturbed(now, paused)

    def _watch_islands(self, now: float,
                       membership_changed: Callable[[str, float, bool], None]) -> int:
        """How many islands are alive (and, in `sending`, which of them are past their
        start); marks the others lost and the returning revived."""
        config = self.spec.config
        sending = set()
        timeout = config.liveness.heartbeat_timeout_s
        rejoins = self.store.control.rejoin_requests()
        alive = 0
        for island in config.islands:
            beat = self.heartbeats.get(island.name)
            death = self.deaths.get(island.name)
            state = condition(beat, death, self.epochs.get(island.name, 0), now, timeout)
            if state == "alive":
                alive += 1
                if beat.state != "starting":
                    sending.add(island.name)
                asked = rejoins.get(island.name)
                if asked is not None and beat.state == "training" \
                        and beat.epoch == self.epochs.get(island.name):
                    self.store.control.close_rejoin_request(island.name)
                    # With where the seconds went (trainer/phases.py) and whether a warm
                    # standby took it.
                    self.recorder.event("rejoin", island.name, epoch=beat.epoch,
                                        seconds_to_first_step=round(beat.time - asked, 3),
                                        phases=beat.phases or {},
                                        first_step_cpu_s=beat.first_step_cpu_s,
                                        warm=beat.warm)
                if island.name in self.lost:
                    self.lost.discard(island.name)
                    self.unheard.discard(island.name)
                    self.recorder.event("island_revived", island.name, epoch=beat.epoch)
                    membership_changed(island.name, now, True)
                self.recorder.island(island.name, state="training", tokens=beat.tokens,
                                     inner_steps=beat.step)
                self._track_rate(island.name, beat)
            elif state in ("dead", "silent") and island.name not in self.lost:
                self.lost.add(island.name)
                if state == "dead":
                    self.recorder.event("island_lost", island.name, cause="died",
                                        epoch=death["epoch"], exit_code=death.get("exit_code"),
                                        signal=death.get("signal"),
                                        reported_after_s=round(max(now - death["time"], 0.0),
                                                               3))
                else:
                    self.unheard.add(island.name)
                    self.recorder.event("island_lost", island.name, cause="silent",
                                        silent_s=round(now - beat.time, 1))
                self.recorder.island(island.name, state="lost")
                membership_changed(island.name, now, False)
        k = config.sync.min_quorum
        if alive < k and not self.waiting_alert and self.heartbeats:
            self.recorder.event("alert", None, message=f"waiting: {alive} of the {k} islands "
                                f"needed for a merge are alive")
        self.waiting_alert = alive < k
        self.sending = frozenset(sending)
        return alive

    def _track_rate(self, island: str, beat: Heartbeat) -> None:
        """Tokens per second of an island over windows of at least RATE_WINDOW_S of its
        heartbeats, one after the other; and its seconds per inner step over at least
        RATE_WINDOW_S from the heartbeat that showed a step to one that shows a later
        step. A step longer than the window spans several windows: a step time of one
        window would be its length, not the step's (a 2 s step read 1.0-1.5 s). A
        stalled island keeps its last step time and shows its heartbeat's age."""
        mark = self.rate_marks.get(island)
        if mark is None or beat.tokens < mark[1] or beat.step < mark[2]:
            self.rate_marks[island] = (beat.time, beat.tokens, beat.step)
        elif beat.time - mark[0] >= RATE_WINDOW_S:
            elapsed = beat.time - mark[0]
            self.tokens_per_s[island] = (beat.tokens - mark[1]) / elapsed
            self.rate_marks[island] = (beat.time, beat.tokens, beat.step)
        step_mark = self.step_marks.get(island)
        if step_mark is None or beat.step < step_mark[1]:
            self.step_marks[island] = (beat.time, beat.step)
        elif beat.step > step_mark[1] and beat.time - step_mark[0] >= RATE_WINDOW_S:
            self.step_time_s[island] = (beat.time - step_mark[0]) / (beat.step
                                                                        - step_mark[1])
            self.step_marks[island] = (beat.time, beat.step)

    def _note_disturbed(self, now: float, paused: bool) -> None:
        """Islands faulted or lost at `now` were held up, and every island while a user
        paused the run (a step time spanning the pause is no training pace); so was the
        whole run, behind a barrier (never earlier than the end of a restart's pause:
        `hold_up_run`)."""
        disturbed = [*self.faults, *self.lost]
        if paused:
            disturbed += [island.name for island in self.spec.config.islands]
        for island in disturbed:
            self.disturbed[island] = now
        if disturbed:
            self.disturbed[""] = max(self.disturbed.get("", now), now)

    def hold_up_run(self, until: float) -> None:
        """Elastic: a whole-job restart holds every island up until `until`, so that no
        island's step time spans its pause."""
        self.disturbed[""] = until

    def disturbed_since(self, island: str, since: float) -> bool:
        """Whether `island` was faulted, lost or paused since `since`; in elastic,
        whether any island was or the job restarted, since the barrier holds every
        island up."""
        last = self.disturbed.get(island, -math.inf)
        if self.spec.elastic:
            last = max(last, self.disturbed.get("", -math.inf))
        return island in self.faults or last >= since

    def islands_stopped(self, now: float) -> bool:
        """Whether no island of the run still trains: each has said it stopped, is
        lost, has an epoch newer than its last heartbeat's, or is silent."""
        config = self.spec.config
        timeout = config.liveness.heartbeat_timeout_s
        for island in config.islands:
            beat = self.heartbeats.get(island.name)
            if beat and beat.state != "stopped" and island.name not in self.lost \
                    and beat.epoch >= self.epochs.get(island.name, 0) \
                    and now - beat.time <= timeout:
                return False
        return True
