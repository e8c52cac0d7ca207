"""syncd's loop over one run: a few parts, each owning its state, called in
order by a short tick.

- the spec (syncd/spec.py): the run's config as it is now, its secret and mode;
- liveness (syncd/liveness.py): heartbeats, epochs, deaths, lost islands, rates;
- rounds (syncd/rounds.py): the Synchronizer and its merges, fed from the update
  stream (syncd/ingester.py), published on a thread of their own (syncd/publisher.py);
- recovery (syncd/recovery.py): checkpoints, the elastic restore point and
  whole-job restart, the fall-back to a checkpoint when Redis lost the run;
- accounting (diloco.accounting.RunAccounting): goodput and uptime, which the
  others tell what they merged or lost;
- the chaos driver (syncd/chaos_driver.py), for a run with a chaos schedule;
- the status (syncd/status.py), a read-only view of the others.

RunSync owns what ties them together: the tick's cadences, the evaluation, a user's stop
and the run's end (the outcome, syncd/outcome.py). State survives a restart of syncd:
the versions and handled seqs are in the control Redis, the globals and momentum on the
data plane and in syncd's files (one write per merge, syncd/published_files.py). The
open rounds are not (each update is folded into its round's sum and freed as it arrives,
syncd/ingester.py): the islands send again what syncd has not handled when its lease
changes hands (trainer/resend.py). RunSync also watches the data plane: a restart of it
is published again at once, and its refusals for memory are an alert in the run's
events.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from pathlib import Path

from diloco.accounting import RunAccounting
from diloco.fragments import partition
from diloco.island import initial_model
from syncd import checkpoint, outcome
from syncd.chaos_driver import ChaosDriver
from syncd.corpus import RunCorpus
from syncd.environment import data_dir
from syncd.evaluation import EVAL_CPU_SHARE, GlobalEval
from syncd.finite import finite
from syncd.hooks import Recorder
from syncd.ingest import message_limit
from syncd.key_bounds import KeyBounds
from syncd.liveness import Liveness
from syncd.pass_times import PassTimes
from syncd.pool_store import PoolStore
from syncd.published_files import PublishedFiles
from syncd.records import Heartbeat, RunStatus
from syncd.recovery import Recovery
from syncd.rounds import Rounds
from syncd.spec import RunSpec
from syncd.status import StatusSources, run_status
from syncd.store import RunStore
from syncd.waiting import RunWaiting

log = logging.getLogger("archipelago.syncd")
STATUS_EVERY_S = 0.5
# The status (its accounting, its push) takes at most this share of one core: a status
# that took c CPU seconds to make is the last for c / STATUS_CPU_SHARE seconds.
STATUS_CPU_SHARE = 0.05
FLUSH_EVERY_S = 1.0
CONTROL_EVERY_S = 0.2
# A stopped run waits this long at most for its islands to send what they have and
# exit (their supervisors SIGKILL an island still running 30 s after its SIGTERM).
STOP_WAIT_S = 35.0
DATAPLANE_EVERY_S = 1.0  # how often the data plane is looked at (lost? refusing?)
# The data plane's refusals for memory are an alert at most this often per run.
DATAPLANE_ALERT_EVERY_S = 60.0


class RunSync:
    """The synchronizer of one run, fed from Redis.

    Args:
        store: the run's Redis keys.
        recorder: batches the run's database rows.
        checkpoint_dir: where this run's checkpoints go.
        clock: the time source (seconds).
        notify: called with (run id, sequence number, status) at each new snapshot,
            to push it to the control room.
        control_every_s: how often heartbeats, faults, pauses, requests and the spec
            are read from Redis (updates are read on every pass).
        rejoin: starts the next epoch of (run id, island), as a chaos kill ends.
        keepalive: called between the pieces of long work (building the model,
            restoring each fragment, each update ingested, each merge), so that
            syncd renews its leases while a pass over a big run takes seconds.
        eval_cpu_share: the share of the host's CPU live evaluation takes on average
            (syncd/evaluation.py).
    """

    def __init__(self, store: RunStore, recorder: Recorder, checkpoint_dir: Path,
                 clock: Callable[[], float] = time.time,
                 notify: Callable[[str, int, dict], None] | None = None,
                 control_every_s: float = CONTROL_EVERY_S,
                 rejoin: Callable[[int, str], None] | None = None,
                 keepalive: Callable[[], None] = lambda: None,
                 eval_cpu_share: float = EVAL_CPU_SHARE):
        self.store = store
        self.recorder = recorder
        self.clock = clock
        self.notify = notify
        self.control_every_s = control_every_s
        self.spec = spec = RunSpec(store)
        self.pools = PoolStore(store.client)  # whether a rejoin would start warm
        config = spec.config
        params = checkpoint.initial_params(spec.initial, initial_model(config))
        keepalive()
        fragments = partition({k: v.numel() for k, v in params.items()}, config.sync.fragments)
        # No stream entry claims a message larger than the whole model's honest update:
        # what syncd reads or deletes in an entry's name is bounded by the run's model.
        store.updates.max_update_bytes = message_limit({k: tuple(v.shape)
                                                        for k, v in params.items()})
        # Goodput and uptime of this syncd's watch; a restart of syncd starts them anew.
        self.accounting = RunAccounting([i.name for i in config.islands], clock(),
                                        fragments=len(fragments))
        self.liveness = Liveness(store, recorder, spec)
        self.waiting = RunWaiting(store, spec)
        # An island removed from the run keeps its epoch, and its cursor for its return.
        self.bounds = KeyBounds(store, recorder, lambda: [
            *(i.name for i in self.spec.config.islands), *self.liveness.epochs])
        self.rounds = Rounds(store, recorder, spec, self.accounting, params, fragments,
                             clock, keepalive,
                             PublishedFiles.of_run(checkpoint_dir, store.run_id))
        del params
        keepalive()
        self.corpus = corpus = RunCorpus.of_run(config.data, data_dir())  # in a thread
        self.recovery = Recovery(store, recorder, spec, self.accounting, checkpoint_dir, clock,
                                 corpus)
        self.chaos = ChaosDriver.for_run(store, recorder, spec, rejoin, self.accounting.clock.start)
        self.evaluation = GlobalEval(config, cpu_share=eval_cpu_share, corpus=corpus)
        self.eval_loss: float | None = None
        self.eval_tokens: int | None = None  # tokens merged into the model eval_loss is of
        self.eval_bpb: float | None = None  # eval_loss in bits per byte
        self.evaluating_tokens = 0
        self.next_status = self.next_flush = self.next_control = self.next_dataplane = 0.0
        self.last_status: RunStatus | None = None  # links count their bytes from it
        self.passes = PassTimes()
        self.completed = False
        self.stop_seen: float | None = None  # when this syncd saw the user's stop
        self.evaluate_at_end = True  # not when syncd itself stops (finish_stop)
        versions = store.globals.versions()
        if not (versions and self.rounds.restore(versions)) \
                and not self.recovery.fall_back_to_checkpoint(self.rounds):
            self.rounds.restore({})
        store.globals.mark_dataplane()
        self.refusals = store.globals.dataplane_refusals()  # the data plane's, seen so far
        self.next_refusal_alert = 0.0
        self._take_over(store.signals.heartbeats())
        self.overcredited: set[str] = set()  # islands a warning was logged for

    def _take_over(self, heartbeats: dict[str, Heartbeat]) -> None:
        """This syncd's accounting starts now, and a run that was training (another
        syncd's, or this one's before a restart) has updates in flight: per island and
        fragment, the steps up to the larger of the seq handled and the island's last
        heartbeat step were trained before, and no merge credits them."""
        for island in self.accounting.islands:
            step = beat.step if (beat := heartbeats.get(island)) else 0
            for p in range(len(self.rounds.fragments)):
                before = max(self.rounds.sync.handled_seq(p, island, default=0), step, 0)
                if before:
                    self.accounting.trained_before(island, before, fragment=p)

    # -- one pass ------------------------------------------------------------

    def tick(self) -> bool:
        """Ingest what arrived, merge what may merge, watch liveness; True if busy."""
        now = self.clock()
        self.passes.mark(now)
        # Epochs every pass: they fence off old epochs before their updates count.
        # Deaths too: a death report marks its island lost on this very pass.
        epochs, deaths = self.store.signals.epochs_and_deaths()
        self.recovery.account_new_epochs(epochs, self.liveness, self.rounds)
        if self.liveness.follow_epochs(epochs, deaths):
            self.next_control = now
        if now >= self.next_control:
            self.next_control = now + self.control_every_s
            self._watch(now)
        if self.completed:
            # The budget is spent and the run's tokens are recorded: no merge after that.
            return False
        busy, read_all = self.rounds.ingester.ingest(now, self.liveness)
        sending = self.liveness.sending if self.waiting.waits() else None  # syncd's tau 0
        for p in range(len(self.rounds.fragments)):
            if self.rounds.maybe_merge(p, now, self.liveness.alive, sending) and self.spec.elastic:
                self._finish_merges(now)  # the restore point is the outer step's state
        if self.rounds.publisher.publishing:
            # The next round's updates are read while the merges are published.
            self.rounds.ingest_while_publishing(self.liveness)
            read_all = False
        self._finish_merges(now)
        if self.stop_seen is not None and read_all and (
                self.liveness.islands_stopped(now) or now >= self.stop_seen + STOP_WAIT_S):
            self._stop(now)  # everything the islands sent is read
            return False
        self._evaluate(now)
        if now >= self.next_status:
            began = time.thread_time()
            self._put_status(now)
            self.next_status = now + max(STATUS_EVERY_S,
                                         (time.thread_time() - began) / STATUS_CPU_SHARE)
        self.recovery.checkpoint_if_due(now, self.rounds, self.eval_loss)
        if now >= self.next_flush or self.completed:
            self.next_flush = now + FLUSH_EVERY_S
            self.recorder.flush()
        return busy

    def _watch(self, now: float) -> None:
        """What changes at human or heartbeat pace, read a few times a second rather
        than on every pass: the spec, heartbeats, faults, a pause, requests, the budget."""
        self._follow_spec()
        self.liveness.read()
        self.rounds.observe_links(self.liveness.heartbeats, self.liveness.lost)
        sync = self.spec.config.sync
        step_s = self.rounds.round_stats().step_time_s if self.rounds.ingester.step_time \
            else None
        self.waiting.observe(now, self.liveness.heartbeats, step_s,
                             sync.inner_steps / sync.fragments)
        self.recovery.note_first_startups(self.liveness.heartbeats)
        paused = self.store.control.paused()
        if paused != self.accounting.clock.paused:
            (self.accounting.clock.pause if paused else self.accounting.clock.resume)(now)
        self.liveness.watch(now, paused, self._membership_changed)
        if self.chaos is not None and not paused:
            self.chaos.tick(now, self.liveness)
        if self.store.control.take_checkpoint_request():
            self.recovery.ask_for_checkpoint()
        if self.stop_seen is None and self.store.control.stop_requested() is not None:
            self.stop_seen = now
        self.rounds.ingester.trim()
        self.bounds.look(now)
        self.rounds.ingester.free_stale_slots(now, self.liveness)
        self._check_budget()
        if now >= self.next_dataplane:
            self.next_dataplane = now + DATAPLANE_EVERY_S
            self._watch_dataplane(now)

    def _watch_dataplane(self, now: float) -> None:
        """A data plane that restarted gets every fragment published again; one that
        refused writes for memory is an alert (at most one a minute), since updates
        and merges then wait while heartbeats, status and control go on."""
        if self.store.globals.dataplane_lost():
            self.rounds.publisher.republish()
            self.store.globals.mark_dataplane()
            self.recorder.event("alert", None, reason=(
                "the data-plane Redis lost the run's published fragments (it restarted or "
                "was flushed); syncd published every fragment's newest version again, "
                f"versions {self.rounds.sync.versions()}; updates in flight there are "
                "lost and refused as missing"))
        refusals = self.store.globals.dataplane_refusals()
        if refusals > self.refusals and now >= self.next_refusal_alert:
            self.next_refusal_alert = now + DATAPLANE_ALERT_EVERY_S
            self.recorder.event("alert", None, reason=(
                f"the data-plane Redis is full: it refused {refusals - self.refusals} "
                f"writes for memory ({self.store.globals.dataplane_memory()}); islands' updates "
                "and syncd's merges wait until it has room, heartbeats, status and control "
                "go on. Give it more memory (REDIS_MAXMEMORY_MB / DATAPLANE_REDIS_URL's "
                "maxmemory) or run fewer islands"), refused=refusals - self.refusals)
            self.refusals = refusals

    def _follow_spec(self) -> None:
        """Islands may be added to or removed from a running run: follow its spec."""
        before = self.spec.island_names()
        if not self.spec.follow():
            return
        after = self.spec.island_names()
        now = self.clock()
        for island in sorted(after - before):
            self.accounting.add_island(island, now)
        for island in sorted(before - after):
            self.accounting.remove_island(island, now)
        self.rounds.follow_spec()

    def _membership_changed(self, island: str, now: float, joining: bool) -> None:
        """An island was lost or came back: elastic restarts the whole job, as
        torchelastic does on any change of membership."""
        if self.spec.elastic:
            self.recovery.restart_job(now, island, self.rounds, self.liveness, joining=joining)

    def _finish_merges(self, now: float) -> None:
        """Wait for the merges being published and account them (Publisher.finish),
        then take each outer step they made."""
        for _ in range(self.rounds.publisher.finish(now)):
            self._outer_step(now)

    def _outer_step(self, now: float) -> None:
        """Every fragment merged once more: elastic's restore point, and its checkpoint."""
        if self.spec.elastic:
            self.recovery.mark_restore_point(now, self.rounds, self.eval_loss)

    def _evaluate(self, now: float) -> None:
        """Start an evaluation of the global model when one is due; pick up the loss of
        one that finished; report the records the corpus' preparation skipped."""
        if (skipped := self.corpus.report()) is not None:
            self.recorder.event("alert", None, **skipped)
        sync = self.rounds.sync
        if self.evaluation.due(sync.outer_steps, now) \
                and self.evaluation.start(sync.global_params()):
            self.evaluating_tokens = self.rounds.tokens_merged()
        if (loss := self.evaluation.result()) is not None:
            # The loss is the model's of when the evaluation started: those tokens.
            self._evaluated(loss, self.evaluating_tokens)

    def _evaluated(self, loss: float, tokens: int) -> None:
        """Keep an evaluation's loss, the tokens merged into the model it is of, and the
        loss in bits per byte."""
        self.eval_loss, self.eval_tokens = loss, tokens
        self.eval_bpb = self.evaluation.bits_per_byte(loss)

    def waiting_on(self) -> tuple[str, bytes]:
        """The update stream's key and the last entry read: what a quiet syncd blocks on."""
        return self.store.key("updates"), self.rounds.ingester.after

    def wake_in(self) -> float | None:
        """Seconds until one of the run's open rounds is decided again on the clock (its
        grace window closes), None if none waits on it: a quiet syncd blocks no longer."""
        wake_at = self.rounds.wake_at()
        return None if wake_at is None else wake_at - self.clock()

    # -- status ----------------------------------------------------------------

    def status(self, now: float) -> RunStatus:
        """The run's status snapshot at `now` (its links against the last one kept)."""
        regions = {island.region for island in self.spec.config.islands}
        return run_status(now, StatusSources(
            self.store.run_id, self.spec, self.rounds, self.liveness, self.accounting,
            eval_loss=self.eval_loss, eval_tokens=self.eval_tokens, eval_bpb=self.eval_bpb,
            tick_s=self.passes.tick_s, tau=self.waiting.tau(),
            wait_slowdown=self.waiting.overlap.slowdown(), corpus=self.corpus.status(),
            standbys={region: self.pools.ready(region) for region in regions}),
            previous=self.last_status)

    def _put_status(self, now: float) -> None:
        """Keep a status snapshot in Redis and in the history, and push it."""
        status = finite(self.status(now))
        self.last_status = status
        self._warn_overcredited(status)
        seq = self.store.put_status(status)
        self.recorder.metric(status, now)
        self._record_progress(status)
        if self.notify:
            self.notify(self.store.run_id, seq, status)

    def _warn_overcredited(self, status: RunStatus) -> None:
        """An island credited above its allocation is a bug in the figures: logged once
        per island, and the status says so (`overcredited`)."""
        new = set(status["overcredited"]) - self.overcredited
        if new:
            log.warning("run %s: islands %s were credited more useful seconds than they "
                        "were allocated; their goodput is above 1", self.store.run_id,
                        ", ".join(sorted(new)))
            self.overcredited |= new

    def _record_progress(self, status: RunStatus) -> None:
        """Tokens merged, outer steps and progress (tokens / budget, at most 1) of a
        status snapshot, for the Run row."""
        tokens = status["tokens_merged"]
        self.recorder.progress(tokens, status["outer_steps"],
                               min(1.0, tokens / self.spec.config.budget.total_tokens))

    # -- the run's end ---------------------------------------------------------

    def _check_budget(self) -> None:
        if not self.completed \
                and self.rounds.tokens_merged() >= self.spec.config.budget.total_tokens:
            self._complete()

    def _complete(self) -> None:
        """The budget is spent: the run ends as completed (or as stopped, if a user's stop
        was under way)."""
        self._end("stopped" if self.stop_seen is not None else "completed")
        log.info("run %s completed: %d tokens merged, eval loss %s", self.store.run_id,
                 self.rounds.tokens_merged(), self.eval_loss)

    def stop_under_way(self) -> bool:
        """Whether a user's stop of the run is under way and not yet done."""
        if self.stop_seen is None and self.store.control.stop_requested() is not None:
            self.stop_seen = self.clock()
        return self.stop_seen is not None and not self.completed

    def finish_stop(self, wait_s: float, wait: Callable[[float], None]) -> None:
        """As syncd stops: a stop under way is done now rather than at the next start.
        The run is ticked while any island still trains, `wait_s` at most (`wait`
        blocks for updates up to the seconds it is given), then it stops as a tick
        would stop it, its final checkpoint written, without the final evaluation (the
        outcome carries the last one measured: syncd has seconds left, not minutes)."""
        deadline = self.clock() + wait_s
        self.evaluate_at_end = False
        while not self.completed and self.clock() < deadline \
                and not self.liveness.islands_stopped(self.clock()):
            if not self.tick():
                wait(min(0.1, max(deadline - self.clock(), 0.0)))
        if not self.completed:
            self._stop(self.clock())

    def _stop(self, now: float) -> None:
        """A user's stop, once the islands sent what they had and exited (or the wait ran
        out): merge every open round as it is, whatever the quorum, and end the run as
        stopped, its final checkpoint kept."""
        for p in range(len(self.rounds.fragments)):
            if self.rounds.sync.open_round(p) and self.rounds.merge_round(p, now, "stop") \
                    and self.spec.elastic:
                self._finish_merges(now)  # the restore point is the outer step's state
        self._finish_merges(now)
        self._end("stopped")
        log.info("run %s stopped: %d tokens merged, eval loss %s", self.store.run_id,
                 self.rounds.tokens_merged(), self.eval_loss)

    def _end(self, state: str) -> None:
        """Mark the run done, write the final checkpoint (a checkpoint event), evaluate
        the global model, keep the final snapshot with its outcome, record the run's
        tokens and the islands as stopped, move the run to `state` (completed or stopped)
        and free the run's Redis keys but that snapshot and the logs. No merge follows.

        The checkpoint comes first: an evaluation that fails (the corpus missing on
        syncd's host, say) is recorded as an alert and the run still ends, its training
        saved; the outcome then carries the last eval loss that was measured, as it does
        when syncd itself stops (finish_stop: no final evaluation). The final
        evaluation's loss is the final checkpoint's, whose row takes it once measured."""
        self.completed = True
        self.store.control.mark_done()
        final = self.recovery.save_checkpoint(self.rounds, self.eval_loss)
        try:
            if self.evaluate_at_end:
                self._evaluated(self.evaluation(self.rounds.sync.global_params()),
                                self.rounds.tokens_merged())
                self.recorder.checkpoint_evaluated(final, self.eval_loss)
        except Exception as exc:
            log.exception("run %s: the final evaluation failed", self.store.run_id)
            error = f"{type(exc).__name__}: {exc}"
            self.recorder.event("alert", None, evaluation_failed=error,
                                message=f"The final evaluation failed ({error}); the final "
                                        "checkpoint is saved and the run ends without it.")
        now = self.clock()
        status = self.status(now)
        status["outcome"] = outcome.finish(
            self.accounting, self.spec, now, tokens_merged=self.rounds.tokens_merged(),
            eval_loss=self.eval_loss, versions=self.rounds.sync.versions(),
            theta_s=status["theta_s"])
        status = finite(status)
        self.store.put_status(status)
        self._record_progress(status)
        self.next_status = math.inf  # the final snapshot, with the outcome, stays
        for island in self.spec.config.islands:
            self.recorder.island(island.name, state="stopped")
        self.recorder.flush()
        self.recorder.end(state)
        self.store.release()  # its last status (with the outcome) and the logs stay
        self.rounds.files.clear()
