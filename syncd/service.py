"""syncd's live loop: ingest updates from Redis, merge, publish, watch islands.

One RunSync per active run holds a Synchronizer (the same class the
in-process cluster uses) and feeds it from the run's update stream. A merge is
acknowledged once RunStore.publish has committed it. State survives a restart
of syncd: the globals, versions, momentum and handled seqs are in Redis, and
the updates of open rounds are read again from the stream, where ingestion is
idempotent (an update whose seq is already handled or pending is skipped).
"""

from __future__ import annotations

import json
import logging
import statistics
import time
from collections import Counter, deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from diloco import tensorfile
from diloco.accounting import RunAccounting
from diloco.cluster import transfer_time
from diloco.config import config_from_spec
from diloco.fragments import partition
from diloco.island import initial_model
from diloco.model import embedding_tensor_names
from diloco.policy import Decision, RoundStats
from diloco.protocol import decode_message, encode_message
from diloco.synchronizer import Synchronizer, history_length
from syncd import chaos_driver, checkpoint, liveness, outcome, recovery
from syncd.evaluation import GlobalEval
from syncd.hooks import Recorder
from syncd.ingest import IslandFacts, Rejection, check_update, message_limit
from syncd.status import run_status
from syncd.store import RunStore, UpdateRef

log = logging.getLogger("archipelago.syncd")
STATUS_EVERY_S = 0.5
# Updates are ingested for at most this long in one pass, so that merges, the status
# and the leases of every run syncd serves keep their pace behind a backlog of big ones.
INGEST_BUDGET_S = 1.0
FLUSH_EVERY_S = 1.0
CONTROL_EVERY_S = 0.2
READ_COUNT = 256  # stream entries read per pass
# A stopped run waits this long at most for its islands to send what they have and
# exit (their supervisors SIGKILL an island still running 30 s after its SIGTERM).
STOP_WAIT_S = 35.0


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
        rejoin: starts the next incarnation of (run id, island), as a chaos kill ends.
        keepalive: called between the pieces of long work (building the model,
            restoring each fragment, each update ingested, each merge), so that
            syncd renews its leases while a pass over a big run takes seconds.
    """

    def __init__(self, store: RunStore, recorder: Recorder, checkpoint_dir: Path,
                 clock: Callable[[], float] = time.time,
                 notify: Callable[[str, int, dict], None] | None = None,
                 control_every_s: float = CONTROL_EVERY_S,
                 rejoin: Callable[[int, str], None] | None = None,
                 keepalive: Callable[[], None] = lambda: None):
        self.store = store
        self.rejoin = rejoin
        self.keepalive = keepalive
        self.notify = notify
        self.recorder = recorder
        self.clock = clock
        self.checkpoint_dir = checkpoint_dir
        spec = store.spec()
        if spec is None:
            raise ValueError(f"run {store.run_id} has no spec in Redis")
        self.spec_raw = self.store.r.get(self.store.key("spec"))
        self.config = config = config_from_spec(spec)
        self.secret = bytes.fromhex(spec["secret"])
        # The elastic baseline: a barrier over live islands at every outer step, a
        # checkpoint after each, and a whole-job restart from it on any island loss.
        self.elastic = spec["mode"] == "elastic"
        self.restore_point: tuple[list[dict], list[dict]] | None = None
        params = checkpoint.initial_params(spec, initial_model(config))
        keepalive()
        self.fragments = partition({k: v.numel() for k, v in params.items()},
                                   config.sync.fragments)
        self.sync = Synchronizer(params, self.fragments, config.sync, config.optim,
                                 config.round_tokens(), embedding_tensor_names())
        del params
        keepalive()
        self.after = b"0-0"
        # Stream entries up to this one may have been read by a syncd before this one:
        # a handled seq among them is a redelivery. After it, a handled seq is a replay.
        newest = store.r.xrevrange(store.key("updates"), count=1)
        self.redelivered_until = _stream_id(newest[0][0]) if newest else (0, 0)
        # fragment -> island -> the stream entries of the updates in its open round
        # (several when increments were added up); their messages go when it merges.
        self.round_refs: list[dict[str, list[UpdateRef]]] = [{} for _ in self.fragments]
        self.norms = [deque(maxlen=32) for _ in self.fragments]
        self.rejections: Counter[str] = Counter()
        # Elastic: islands whose update of the fragment's open round was refused; the
        # barrier does not wait for them (a skipped bad step).
        self.excused: list[set[str]] = [set() for _ in self.fragments]
        self.restart_versions = [0] * len(self.fragments)  # published by the last restart
        self.step_time: dict[str, float] = {}
        self.last_update: dict[tuple[str, int], tuple[float, int, int]] = {}  # time, seq, epoch
        self.last_merge: list[dict[str, Any]] = [{} for _ in self.fragments]
        self.lost: set[str] = set()
        self.waiting_alert = False
        self.epochs: dict[str, int] = {}
        self.deaths: dict[str, dict[str, Any]] = {}  # island -> its supervisor's report
        self.heartbeats: dict[str, dict[str, Any]] = {}
        # island ("" for the whole run) -> the last time it was seen faulted, lost or,
        # for the run, restarting: step times spanning it are not fault-free.
        self.disturbed: dict[str, float] = {}
        self.first_startups: dict[str, float] = {}  # island -> seconds
        self.next_status = self.next_flush = self.next_control = 0.0
        self.last_status: dict[str, Any] = {}  # links count their bytes from it
        self.control_every_s = control_every_s
        self.live = 0
        self.checkpoint_asked = False
        self.next_checkpoint = clock() + config.checkpoint.interval_s
        self.eval_loss: float | None = None
        self.eval_tokens: int | None = None  # tokens merged into the model eval_loss is of
        self.evaluating_tokens = 0
        self.evaluation = GlobalEval(config)
        self.completed = False
        self.stop_seen: float | None = None  # when this syncd saw the user's stop
        # Goodput and uptime of this syncd's watch; a restart of syncd starts them anew.
        self.accounting = RunAccounting([i.name for i in config.islands], clock(),
                                        fragments=len(self.fragments))
        self.restore_time = clock()
        self.faults: dict[str, str] = {}
        self.rate_marks: dict[str, tuple[float, int]] = {}  # island -> (time, tokens)
        self.tokens_per_s: dict[str, float] = {}
        self.restore_tokens: dict[int, int] = {}  # tokens merged at the restore point
        self.chaos = chaos_driver.ChaosDriver.for_run(self)
        self._restore_or_publish_initial()

    # -- state in Redis --------------------------------------------------------

    def _refresh_spec(self) -> None:
        """Islands may be added to or removed from a running run: follow its spec."""
        raw = self.store.r.get(self.store.key("spec"))
        if raw is None or raw == self.spec_raw:
            return
        self.spec_raw = raw
        before = {i.name for i in self.config.islands}
        self.config = config_from_spec(json.loads(raw))
        after = {i.name for i in self.config.islands}
        now = self.clock()
        for island in sorted(after - before):
            self.accounting.add_island(island, now)
        for island in sorted(before - after):
            self.accounting.remove_island(island, now)
        self.sync.round_tokens = self.config.round_tokens()

    def _global_message(self, p: int, version: int) -> bytes:
        meta = {"run": self.store.run_id, "fragment": p, "version": version, "base_version": -1,
                "codec": "none"}
        return encode_message("global", meta, self.sync.globals[p], self.secret)

    def _restore_or_publish_initial(self) -> None:
        versions = self.store.versions()
        if not versions and recovery.fall_back_to_checkpoint(self):
            return
        for p in range(len(self.fragments)):
            if p not in versions:
                self.store.publish(p, 0, self._global_message(p, 0), None,
                                   tensorfile.dumps({}), {}, 0, self.keep_diffs)
                continue
            _, meta, tensors = decode_message(self.store.full(p), self.secret)
            self.sync.globals[p] = {n: t.float() for n, t in tensors.items()}
            self.sync.versions[p] = meta["version"]
            momentum = self.store.momentum(p)
            if momentum:
                self.sync.optimizers[p].load_state_dict(tensorfile.loads(momentum)[1])
            self.sync.handled[p] = self.store.handled(p)
            self.keepalive()
        if versions:
            log.info("run %s restored at versions %s", self.store.run_id, self.sync.versions)

    @property
    def keep_diffs(self) -> int:
        """Published differences kept in Redis per fragment: as far back as an island
        may lag (max_staleness); none without a lossy downlink."""
        return history_length(self.config.sync)

    def take_round(self, p: int) -> list[UpdateRef]:
        """Forget fragment p's open round here: the stream entries of its updates, whose
        messages the next publish or mark deletes."""
        refs = [ref for island_refs in self.round_refs[p].values() for ref in island_refs]
        self.round_refs[p] = {}
        return refs

    def publish(self, p: int, result_tokens: int, done: list[UpdateRef] = ()) -> None:
        """Commit fragment p's newest version; `done` are the updates it took in (or
        threw away), whose messages go in the same transaction."""
        version = self.sync.versions[p]
        diff = None
        history = self.sync.history[p]
        if history and history[-1].version == version:  # a lossy downlink's difference
            pub = history[-1]
            meta = {"run": self.store.run_id, "fragment": p, "version": version,
                    "base_version": version - 1, "codec": pub.codec}
            diff = encode_message("global", meta, pub.payload, self.secret)
        momentum = tensorfile.dumps(self.sync.optimizers[p].state_dict())
        self.store.publish(p, version, self._global_message(p, version), diff, momentum,
                           dict(self.sync.handled[p]), result_tokens, self.keep_diffs, done)

    # -- one pass ------------------------------------------------------------

    def tick(self) -> bool:
        """Ingest what arrived, merge what may merge, watch liveness; True if busy."""
        now = self.clock()
        # Epochs every pass: they fence off old incarnations before their updates count.
        # Deaths too: a death report marks its island lost on this very pass.
        epochs, deaths = self.store.epochs_and_deaths()
        recovery.account_new_incarnations(self, epochs)
        self.epochs = epochs
        if deaths != self.deaths:
            self.deaths = deaths
            self.next_control = now
        if now >= self.next_control:
            self.next_control = now + self.control_every_s
            self._watch(now)
        if self.completed:
            # The budget is spent and the run's tokens are recorded: no merge after that.
            return False
        refs = self.store.read_updates(self.after, count=READ_COUNT)
        budget_end = time.monotonic() + INGEST_BUDGET_S
        read_all = len(refs) < READ_COUNT  # the stream is read to its end this pass
        for i, ref in enumerate(refs):
            self.after = ref.stream_id
            self._ingest(ref, now)
            self.keepalive()
            if time.monotonic() > budget_end:
                read_all &= i == len(refs) - 1
                break  # the rest is read again on the next pass
        for p in range(len(self.fragments)):
            self._maybe_merge(p, now, self.live)
        if self.stop_seen is not None and read_all and (
                self.islands_stopped(now) or now >= self.stop_seen + STOP_WAIT_S):
            outcome.stop(self, now)  # everything the islands sent is read
            return False
        if self.evaluation.due(self.sync.outer_steps, now) \
                and self.evaluation.start(self.sync.global_params()):
            self.evaluating_tokens = self.tokens_merged()
        if (loss := self.evaluation.result()) is not None:
            # The loss is the model's of when the evaluation started: those tokens.
            self.eval_loss, self.eval_tokens = loss, self.evaluating_tokens
        if now >= self.next_status:
            self.next_status = now + STATUS_EVERY_S
            status = run_status(self, now, self.live, self.last_status)
            self.last_status = status
            seq = self.store.put_status(status)
            self.recorder.metric(status, now)
            self.record_progress(status)
            if self.notify:
                self.notify(self.store.run_id, seq, status)
        if now >= self.next_checkpoint or self.checkpoint_asked:
            self.next_checkpoint = now + self.config.checkpoint.interval_s
            self.checkpoint_asked = False
            recovery.save_checkpoint(self)
        if now >= self.next_flush or self.completed:
            self.next_flush = now + FLUSH_EVERY_S
            self.recorder.flush()
        return bool(refs)

    def _watch(self, now: float) -> None:
        """What changes at human or heartbeat pace, read a few times a second rather
        than on every pass: the spec, heartbeats, faults, a pause, requests, the budget."""
        self._refresh_spec()
        self.heartbeats = self.store.heartbeats()
        recovery.note_first_startups(self)
        self.faults = self.store.faults([i.name for i in self.config.islands])
        paused = self.store.paused()
        if paused != self.accounting.paused:
            (self.accounting.pause if paused else self.accounting.resume)(now)
        self.live = 0 if paused else liveness.watch_islands(self, now)
        liveness.note_disturbed(self, now)
        if self.chaos is not None and not paused:
            self.chaos.tick(now)
        self.checkpoint_asked |= self.store.take_checkpoint_request()
        if self.stop_seen is None and self.store.stop_requested() is not None:
            self.stop_seen = now
        self._trim()
        self._check_budget()

    def _ingest(self, ref: UpdateRef, now: float) -> None:
        p = ref.fragment
        if not 0 <= p < len(self.fragments):
            self._reject(ref, f"no fragment {p}")
            return
        pending = self.sync.rounds[p].get(ref.island)
        if ref.seq <= self.sync.handled[p].get(ref.island, -1) or (
                pending is not None and ref.seq <= pending.update.seq):
            # Merged at most once; what another syncd may have read is redelivered
            # silently, anything newer is a replay.
            if _stream_id(ref.stream_id) > self.redelivered_until:
                self._reject(ref, f"replayed seq {ref.seq}: island {ref.island} already sent "
                                  f"an update of fragment {p} with this seq or a later one")
            elif ref.blob not in (r.blob for r in self.round_refs[p].get(ref.island, ())):
                self.store.drop_updates([ref])  # done with before this syncd took the run
            return
        island = next((i for i in self.config.islands if i.name == ref.island), None)
        facts = None if island is None else IslandFacts(
            self.epochs.get(ref.island, 0), island.batch_size * self.config.model.block_size)
        try:
            update, norm = check_update(
                lambda limit: self.store.update_message(ref, limit), ref, self.secret, facts,
                self.sync.shapes[p], list(self.norms[p]), message_limit(self.sync.shapes[p]))
        except Rejection as exc:
            self._reject(ref, str(exc))
            return
        if self.elastic and update.base_version < self.restart_versions[p]:
            # Sent before a whole-job restart and read after it: thrown away with the
            # rollback (restart_job counted its steps), and its island no longer waits
            # for it. In a round it would stand for the island's first update after.
            self.sync.handled[p][ref.island] = max(ref.seq,
                                                   self.sync.handled[p].get(ref.island, -1))
            self.store.drop_updates([ref])
            return
        reason = self.sync.submit(update, p, now)
        if reason is not None:
            self._reject(ref, reason)
            return
        self.norms[p].append(norm)
        self.round_refs[p].setdefault(ref.island, []).append(ref)
        previous = self.last_update.get((ref.island, p))
        # Within one incarnation only: the gap across a kill and rejoin is down time.
        if previous is not None and previous[2] == ref.epoch and ref.seq > previous[1] \
                and now > previous[0]:
            steps = ref.seq - previous[1]
            self.step_time[ref.island] = (now - previous[0]) / steps
            self.accounting.observe_step_time(ref.island, self.step_time[ref.island],
                                              faulted=liveness.disturbed_since(
                                                  self, ref.island, previous[0]),
                                              steps=steps)
        self.last_update[(ref.island, p)] = (now, ref.seq, ref.epoch)

    def _reject(self, ref: UpdateRef, reason: str) -> None:
        log.warning("run %s: rejected update %s/%s seq %s from %s: %s", self.store.run_id,
                    ref.fragment, ref.epoch, ref.seq, ref.island, reason)
        self.rejections[ref.island] += 1
        self.store.drop_updates([ref])  # never merged, so never needed again
        self._account_lost_update(ref, reason)
        self.recorder.event("rejection", ref.island, reason=reason, fragment=ref.fragment,
                            seq=ref.seq, epoch=ref.epoch)
        p = ref.fragment
        if 0 <= p < len(self.fragments) and ref.island not in self.sync.rounds[p]:
            # The island may be waiting for this update's fate; it is settled.
            self.sync.handled[p][ref.island] = max(ref.seq,
                                                   self.sync.handled[p].get(ref.island, -1))
            if self.elastic and ref.island in self.accounting.islands:
                # Behind a barrier the island waits for the round like the others (it
                # is told with the merge), so that no island runs a round ahead.
                self.excused[p].add(ref.island)
            else:
                self.store.mark_handled(p, {ref.island: self.sync.handled[p][ref.island]})

    def round_stats(self) -> RoundStats:
        times = list(self.step_time.values()) or [1.0]
        fragment_bytes = max(sum(t.numel() * 4 for t in g.values()) for g in self.sync.globals)
        one_way = statistics.median(transfer_time(i, fragment_bytes,
                                                  self.config.emulation.bytes_scale)
                                    for i in self.config.islands)
        # t_sync is the round trip: the first sender spent its upload before it arrived,
        # and its overlap (tau steps) must cover that, the wait and the download. With
        # only the download the window ran past tau and islands waited (bench simulate:
        # 82.7% against 89.4% goodput at 1.2M chips, M = 8).
        return RoundStats(statistics.median(times), 2 * one_way)

    def _maybe_merge(self, p: int, now: float, live: int) -> None:
        if not self.sync.rounds[p]:
            if self.excused[p] and len(self.excused[p]) >= live:
                # Elastic, every live island's update refused: nothing to merge.
                self.store.mark_handled(p, dict(self.sync.handled[p]))
                self.excused[p].clear()
            return
        decision = self.decide(p, now, live)
        if decision.merge:
            self.merge_round(p, now, decision.reason)

    def merge_round(self, p: int, now: float, reason: str) -> None:
        """Merge fragment p's open round now (`reason`: why), publish and account it."""
        self.excused[p].clear()
        if self.elastic:
            recovery.account_barrier_wait(self, p, now)
        outer_steps = self.sync.outer_steps
        closed_at = max(pending.arrival_time for pending in self.sync.rounds[p].values())
        result = self.sync.merge(p, now)
        done = self.take_round(p)
        if result is None:
            self.store.mark_handled(p, dict(self.sync.handled[p]), done)
            return
        self.publish(p, result.tokens, done)
        self.keepalive()
        self.accounting.merged_round(result.weights, result.inner_steps, now, fragment=p,
                                     version=result.version)
        self.last_merge[p] = {"version": result.version, "weights": result.weights,
                              "reason": reason, "dropped": result.dropped_stale}
        # From the pass that read the update closing the round to the merge committed.
        latency = round(max(self.clock() - closed_at, 0.0), 4)
        self.recorder.event("merge", None, fragment=p, version=result.version,
                            weights=result.weights, tokens=result.tokens,
                            reason=reason, latency_s=latency)
        if self.elastic and self.sync.outer_steps > outer_steps:
            recovery.mark_restore_point(self, now)

    def barrier_size(self, p: int, live: int) -> int:
        """Elastic: the updates fragment p's round waits for, every live island's but
        the refused ones."""
        return max(live - len(self.excused[p]), 1)

    def decide(self, p: int, now: float, live: int) -> Decision:
        """Whether fragment p's round merges now: quorum and grace, or the barrier."""
        return self.sync.decide(p, now, self.barrier_size(p, live) if self.elastic
                                else max(live, 1), self.round_stats(), self.elastic)

    def _account_lost_update(self, ref: UpdateRef, reason: str) -> None:
        """The island-seconds behind a refused update: its steps since the island's
        previous handled update of that fragment, at its fault-free step time."""
        if not 0 <= ref.fragment < len(self.fragments) or ref.island not in {
                i.name for i in self.config.islands}:
            return
        previous = self.sync.handled[ref.fragment].get(ref.island, ref.seq)
        step_time = self.accounting.step_time(ref.island) or 0.0
        cause = "stale" if reason.startswith("stale") else "rejected"
        self.accounting.lost(ref.island, step_time * max(ref.seq - previous, 0), cause)

    def _trim(self) -> None:
        floor = min((refs[0].stream_id for round_ in self.round_refs for refs in round_.values()),
                    default=self.after)
        major, minor = (int(x) for x in floor.split(b"-"))
        if (major, minor) > (0, 0):
            self.store.trim_updates(floor)

    # -- budget, checkpoints, status -----------------------------------------

    def tokens_merged(self) -> int:
        per_fragment = self.store.tokens_merged()
        return sum(per_fragment.values()) // len(self.fragments)

    def _check_budget(self) -> None:
        if not self.completed and self.tokens_merged() >= self.config.budget.total_tokens:
            outcome.complete(self)

    def islands_stopped(self, now: float) -> bool:
        """Whether no island of the run still trains: each has said it stopped, is
        lost, has an incarnation newer than its last heartbeat's, or is silent."""
        timeout = self.config.liveness.heartbeat_timeout_s
        for island in self.config.islands:
            beat = self.heartbeats.get(island.name)
            if beat and beat.get("state") != "stopped" and island.name not in self.lost \
                    and beat["epoch"] >= self.epochs.get(island.name, 0) \
                    and now - beat["time"] <= timeout:
                return False
        return True

    def record_progress(self, status: dict[str, Any]) -> None:
        """Tokens merged, outer steps and progress (tokens / budget, at most 1) of a
        status snapshot, for the Run row."""
        tokens = status["tokens_merged"]
        self.recorder.progress(tokens, status["outer_steps"],
                               min(1.0, tokens / self.config.budget.total_tokens))

    def evaluate(self) -> float:
        return self.evaluation(self.sync.global_params())


def _stream_id(raw: bytes) -> tuple[int, int]:
    """A Redis stream id (b"1700000000000-3") as numbers that sort like the stream."""
    millis, _, seq = raw.decode().partition("-")
    return int(millis), int(seq or 0)
