"""The rounds of a run in syncd: updates read from the stream, checked, merged and
published.

`Rounds` holds the run's Synchronizer (the same class the in-process cluster uses)
and feeds it from the run's update stream. Each update is folded into its round's
sum as it is ingested (diloco/fold.py), and its message and stream entry are
deleted right after: syncd holds one running sum per open fragment round, whatever
the number of islands. A merge is made on syncd's thread and published on a
thread of its own while the next round's updates are read (`maybe_merge`,
`ingest_while_publishing`, `finish_merges`); it is acknowledged once
RunStore.publish has committed it. The versions and handled seqs are in the
control Redis, the globals on the data plane and, durable with their outer
momentum, in syncd's files (syncd.published_files, written once per merge); the
open rounds are in none of them, so a restart of syncd loses them, and each
island sends again what it sent since its last handled seq when it sees syncd's
lease change hands (trainer/resend.py, docs/RELIABILITY.md).
Ingestion is idempotent (an update whose seq is already handled or pending is
skipped), so nothing is merged twice.
"""

from __future__ import annotations

import contextlib
import logging
import statistics
import time
from collections import Counter, deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis
import torch

from diloco.fragments import Fragment
from diloco.model import embedding_tensor_names
from diloco.policy import Decision, RoundStats
from diloco.protocol import ProtocolError, decode_message, encode_message, encode_pieces
from diloco.synchronizer import MergeResult, Synchronizer, history_length
from diloco.wan import transfer_time
from syncd.bulk import BulkError
from syncd.ingest import (
    IslandFacts,
    Rejection,
    Unverified,
    all_finite,
    check_update,
    message_limit,
    verify_update,
)
from syncd.published_files import PublishedFiles
from syncd.quarantine import Quarantine
from syncd.store import RunStore
from syncd.update_stream import BadEntry, UpdateRef
from syncd.upload_slots import RunFacts, SlotKeeper, Ticket

if TYPE_CHECKING:
    from diloco.accounting import RunAccounting
    from syncd.hooks import Recorder
    from syncd.liveness import Liveness
    from syncd.spec import RunSpec

log = logging.getLogger("archipelago.syncd")
# Updates are ingested for at most this long in one pass, so that merges, the status
# and the leases of every run syncd serves keep their pace behind a backlog of big ones.
INGEST_BUDGET_S = 1.0
READ_COUNT = 256  # stream entries read per pass
# A merge the data plane refused for memory is published again after this long.
FULL_RETRY_S = 1.0
# While merges are published, the stream is read again at most this long after it was
# found empty.
PUBLISHING_POLL_S = 0.01
# On the publishing thread, a publish that writes its fragment to the data plane waits
# at most this for the ingest to read an update written before it began
# (UpdateStream.slot_for_publish).
PUBLISH_DRAIN_S = 2.0


@dataclass(frozen=True)
class Unpublished:
    """A merge made in syncd's memory and not yet published: its result, the updates
    it took in, why it merged, when its round closed and whether it made an outer step
    (every fragment merged once more)."""

    result: MergeResult
    done: list[UpdateRef]
    reason: str
    closed_at: float
    outer_step: bool


@dataclass(frozen=True)
class Publication:
    """A merge being published on a thread of its own: what it commits (its bytes
    written to syncd's files, when done) and the handled seqs it writes."""

    future: Future[int]
    handled: dict[str, int]


class Rounds:
    """The open rounds, the globals and what syncd measured of the updates.

    Args:
        store: the run's Redis keys.
        recorder: the run's rows (rejection and merge events).
        spec: the run's spec.
        accounting: the run's goodput, told of step times, merges and lost updates.
        params: the global model's parameters to start from.
        fragments: the partition of `params` the islands use.
        clock: the time source (seconds).
        keepalive: called between the pieces of long work (each fragment restored,
            each update ingested, each merge).
        files: where each fragment's newest version is durable (syncd.published_files).
    """

    def __init__(self, store: RunStore, recorder: Recorder, spec: RunSpec,
                 accounting: RunAccounting, params: dict[str, torch.Tensor],
                 fragments: list[Fragment], clock: Callable[[], float],
                 keepalive: Callable[[], None], files: PublishedFiles):
        self.store = store
        self.files = files
        self.bytes_saved = 0  # written to `files`, for the benchmarks
        self.recorder = recorder
        self.spec = spec
        self.accounting = accounting
        self.clock = clock
        self.keepalive = keepalive
        config = spec.config
        self.fragments = fragments
        self.sync = Synchronizer(params, fragments, config.sync, config.optim,
                                 config.round_tokens(), embedding_tensor_names())
        self.after = b"0-0"
        # fragment -> island -> the stream entries of the updates in its open round
        # (several when increments were added up), already deleted: their epochs.
        self.round_refs: list[dict[str, list[UpdateRef]]] = [{} for _ in fragments]
        self.norms = [deque(maxlen=32) for _ in fragments]
        self.rejections: Counter[str] = Counter()
        self.quarantine = Quarantine(store, recorder)
        self.slots = SlotKeeper()
        # Elastic: islands whose update of the fragment's open round was refused; the
        # barrier does not wait for them (a skipped bad step).
        self.excused: list[set[str]] = [set() for _ in fragments]
        self.restart_versions = [0] * len(fragments)  # published by the last restart
        self.step_time: dict[str, float] = {}
        self.last_update: dict[tuple[str, int], tuple[float, int, int]] = {}  # time, seq, epoch
        # Elastic: each island's barrier waits booked as lost so far, and their total at
        # its last update of each fragment: a step time counts them once, as lost.
        self.waited: Counter[str] = Counter()
        self.waited_at: dict[tuple[str, int], float] = {}
        self.last_merge: list[dict[str, Any]] = [{} for _ in fragments]
        # fragment -> when a merge the data plane refused for memory is published again,
        # and that merge (made in syncd's memory, not yet acknowledged)
        self.merge_after = [0.0] * len(fragments)
        self.unpublished: list[Unpublished | None] = [None] * len(fragments)
        # fragment -> its merge being published (begun by maybe_merge or merge_round,
        # ended by finish_merges)
        self.publishing: dict[int, Publication] = {}
        self._publisher: ThreadPoolExecutor | None = None

    # -- state in Redis --------------------------------------------------------

    def follow_spec(self) -> None:
        """The spec changed: a round's tokens are the new islands'."""
        self.sync.round_tokens = self.spec.config.round_tokens()

    def restore(self, versions: dict[int, int]) -> bool:
        """Go on from the fragments Redis holds (`versions`: fragment -> its newest), and
        publish version 0 of the others. The outer momentum of each comes from syncd's
        files, and so does a fragment the data plane lost (it restarted), which is
        published there again. With a server (the store's `served`), every fragment is
        read from the files and committed again, so its reference names this syncd's
        server. False, with nothing loaded, if a fragment's files are gone or its message
        does not verify, as one of protocol 1 does not (the caller falls back to a
        checkpoint)."""
        found: dict[int, tuple[bytearray, dict[str, Any], dict[str, torch.Tensor],
                               dict[str, torch.Tensor]]] = {}
        again: set[int] = set()
        tokens = self.store.fencing_tokens()
        for p, version in versions.items():
            full = None
            if self.store.served is None:
                with contextlib.suppress(BulkError):
                    full = self.store.full(p)
            saved = self.files.load(p, version, tokens.get(p, 0), full=full is None)
            if saved is None:
                log.warning("run %s: fragment %d version %d is not in %s", self.store.run_id,
                            p, version, self.files.folder)
                return False
            if full is None:
                full = saved[0]
                again.add(p)
            try:
                _, meta, tensors = decode_message(full, self.spec.verify_key)
            except ProtocolError as exc:  # another protocol's (before an upgrade), or torn
                log.warning("run %s: fragment %d version %d does not verify: %s",
                            self.store.run_id, p, version, exc)
                return False
            found[p] = (full, meta, tensors, saved[1])
            self.keepalive()
        for p in range(len(self.fragments)):
            if p not in found:
                self.bytes_saved += self._commit(p, 0, self._global_message(p, 0), None,
                                                 {}, 0, {})
                continue
            full, meta, tensors, momentum = found.pop(p)
            self.load_fragment(p, tensors, momentum, meta["version"])
            self.sync.handled[p] = self.store.handled(p)
            if p in again:  # committed again by this grant: in this grant's file too
                self.bytes_saved += self._commit(p, meta["version"], [memoryview(full)], None,
                                                 momentum, 0, {})
            else:
                self.store.keep_published(p, self._kept_versions(p))
            self.keepalive()
        if versions:
            log.info("run %s restored at versions %s%s", self.store.run_id, self.sync.versions,
                     f" (fragments {sorted(again)} from {self.files.folder})" if again else "")
        return True

    def republish(self) -> None:
        """The data plane lost the run's messages (it restarted): publish every
        fragment's version again from what syncd holds, a commit of this grant's, so in
        its files too. The differences of a lossy downlink are gone; an island behind
        takes the full fragment."""
        for p in range(len(self.fragments)):
            version = self.sync.versions[p]
            self.bytes_saved += self._commit(p, version, self._global_message(p, version), None,
                                             self.sync.optimizers[p].state_dict(), 0, {})
            self.keepalive()
        self.store.mark_dataplane()

    def _kept_versions(self, p: int) -> range:
        """The versions whose published differences of fragment p may still be read."""
        version = self.sync.versions[p]
        return range(max(version - self.kept_differences + 1, 1), version + 1)

    def load_fragment(self, p: int, tensors: dict[str, torch.Tensor],
                      momentum: dict[str, torch.Tensor] | None, version: int) -> None:
        """Make fragment p's global these tensors at `version`, with this outer momentum
        (None: the optimizer's as it is)."""
        self.sync.globals[p] = {n: t.float() for n, t in tensors.items()}
        self.sync.versions[p] = version
        if momentum is not None:
            self.sync.optimizers[p].load_state_dict(momentum)

    def _global_message(self, p: int, version: int,
                        tensors: dict[str, torch.Tensor] | None = None) -> list[memoryview]:
        """Fragment p's full message at `version` of these tensors (its global's), as
        pieces that are views of them (diloco.protocol.encode_pieces): nothing the size
        of the fragment is copied."""
        meta = {"run": self.store.run_id, "fragment": p, "version": version, "base_version": -1,
                "codec": "none"}
        return encode_pieces("global", meta, self.sync.globals[p] if tensors is None
                             else tensors, self.spec.publish_key)

    @property
    def kept_differences(self) -> int:
        """Published differences kept in Redis per fragment: as far back as an island
        may lag (max_staleness); none without a lossy downlink."""
        return history_length(self.spec.config.sync)

    def take_round(self, p: int) -> list[UpdateRef]:
        """Forget fragment p's open round here: the stream entries of its updates, whose
        messages the next publish or mark deletes."""
        refs = [ref for island_refs in self.round_refs[p].values() for ref in island_refs]
        self.round_refs[p] = {}
        return refs

    def publish(self, p: int, result_tokens: int, done: list[UpdateRef] = ()) -> None:
        """Commit fragment p's newest version; `done` are the updates it took in (or
        threw away), whose messages go in the same transaction."""
        self.bytes_saved += self._publication(p, result_tokens, done,
                                              dict(self.sync.handled[p]))()

    def _publication(self, p: int, tokens: int, done: list[UpdateRef],
                     handled: dict[str, int], drain_s: float = 0.0) -> Callable[[], int]:
        """What commits fragment p's newest version with these handled seqs, with what
        it reads taken now: it may run on another thread while this one ingests, and
        fragment p merges no more until it has run. Returns the bytes written to
        syncd's files."""
        version = self.sync.versions[p]
        tensors = self.sync.globals[p]
        history = self.sync.history[p]
        published = history[-1] if history and history[-1].version == version else None
        momentum = self.sync.optimizers[p].state_dict()

        def commit() -> int:
            difference = None
            if published is not None:  # a lossy downlink's difference
                meta = {"run": self.store.run_id, "fragment": p, "version": version,
                        "base_version": version - 1, "codec": published.codec}
                difference = encode_message("global", meta, published.payload,
                                            self.spec.publish_key)
            full = self._global_message(p, version, tensors)
            return self._commit(p, version, full, difference, momentum, tokens, handled, done,
                                drain_s)

        return commit

    def _commit(self, p: int, version: int, full: list[memoryview], difference: bytes | None,
                momentum: dict[str, torch.Tensor], tokens: int, handled: dict[str, int],
                done: list[UpdateRef] = (), drain_s: float = 0.0) -> int:
        """Make fragment p's `version` durable in syncd's files, then commit it
        (RunStore.publish): a data plane that restarts loses no merge. The file is
        written on a thread of its own while the messages go to the data plane (both
        wait on I/O, not on the interpreter), and the commit waits for it; it is this
        grant's file (its fencing token), and once committed the other grants' files
        of p go. Returns the bytes written to the files."""
        token = self.store.fencing_token
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="published-files") as pool:
            saving = pool.submit(self.files.save, p, version, token, full, momentum)
            with self.store.slot_for_publish(p, version, self.spec.config.sync.upload_slots,
                                             drain_s):
                self.store.publish(p, version, full, difference, handled, tokens,
                                   self.kept_differences, done, before_commit=saving.result)
        self.files.keep_only(p, token)
        return saving.result()

    def tokens_merged(self) -> int:
        """Tokens merged into the model: each fragment's, on average."""
        per_fragment = self.store.tokens_merged()
        return sum(per_fragment.values()) // len(self.fragments)

    # -- updates -------------------------------------------------------------

    def ingest(self, now: float, liveness: Liveness,
               until: Callable[[], bool] | None = None) -> tuple[bool, bool]:
        """Read what arrives on the stream into the open rounds, for at most
        INGEST_BUDGET_S: entries that arrive meanwhile too, so that the updates of a
        busy stream fold into the rounds before they merge (with upload slots, few are
        there at once: syncd/upload_slots.py). Returns whether anything was read and
        whether the stream is read to its end. Each entry is taken alone: one that
        speaks for no island is quarantined (syncd/quarantine.py) and its neighbours
        go on. The upload slot of each update is free once its message is verified and
        read (`_release`). `until`: stop early once it is true."""
        budget_end = time.monotonic() + INGEST_BUDGET_S
        read_any = False
        while entries := self.store.read_updates(self.after, count=READ_COUNT):
            read_any = True
            for entry in entries:
                self.after = entry.stream_id
                if isinstance(entry, BadEntry):
                    self.quarantine.add(entry.stream_id, "malformed entry", entry.reason, None)
                else:
                    self._ingest(entry, now, liveness)
                self.keepalive()
                if time.monotonic() > budget_end or (until is not None and until()):
                    self.quarantine.settle(now)
                    return True, False  # the rest is read on the next pass
        self.quarantine.settle(now)
        return read_any, True

    def free_stale_slots(self, now: float, liveness: Liveness) -> None:
        """Take off the queue the tickets that hold an upload slot and are stale (their
        island is lost or of an older epoch, their update handled or never come), until
        the tickets that hold the slots are not. At heartbeat pace (RunSync._watch): what
        makes a ticket stale changes no faster."""
        facts = RunFacts({i.name for i in self.spec.config.islands}, liveness.epochs,
                         liveness.lost, self._handled_seq, self.store.fencing_token)
        while stale := self.slots.stale(self.store.slot_holders(self.spec.config.sync.upload_slots),
                                        now, facts):
            log.warning("run %s: freed %d upload slots held by %s", self.store.run_id,
                        len(stale), [raw.decode(errors="replace")[:80] for raw in stale])
            self.store.free_slots(stale)

    def _release(self, ref: UpdateRef) -> None:
        """Delete a verified update's stream entry and message (syncd holds it now) and
        free its upload slot: the next island in line writes while this one is checked
        and folded. Entry and message go together, so a restarted syncd never reads an
        entry whose message is gone (it would quarantine a genuine update as
        unverified); should syncd die before the fold, the island sends it again
        (trainer/resend.py). An entry that is not verified frees nothing: it is not
        shown to speak for the island whose message and slot it names (but one that
        names an update handled already: that message and ticket are of no use)."""
        self.store.forget_updates([ref])
        self.store.free_slots([Ticket(ref.island, ref.epoch, ref.fragment, ref.seq).encode()])

    def _handled_seq(self, island: str, fragment: int) -> int:
        handled = self.sync.handled
        return handled[fragment].get(island, -1) if 0 <= fragment < len(handled) else -1

    def _ingest(self, ref: UpdateRef, now: float, liveness: Liveness) -> None:
        p = ref.fragment
        config = self.spec.config
        island = next((i for i in config.islands if i.name == ref.island), None)
        if island is None:
            self.quarantine.add(ref.stream_id, "unknown island",
                                f"unknown island {ref.island[:64]!r}", None)
            return
        if not 0 <= p < len(self.fragments):
            self.quarantine.add(ref.stream_id, f"no such fragment ({ref.island})",
                                f"no fragment {p}", ref.island)
            return
        pending = self.sync.rounds[p].get(ref.island)
        if ref.seq <= self.sync.handled[p].get(ref.island, -1) or (
                pending is not None and ref.seq <= pending.contribution.seq):
            # Merged at most once: an update sent again (the same seq, the same message)
            # is the same update, and one before it is done with. Nothing is done in
            # its name (the entry is not verified) but delete the message it names and
            # free its slot, which syncd needs no more.
            self._release(ref)
            return
        try:
            meta, tensors = verify_update(lambda limit: self.store.update_message(ref, limit),
                                          ref, self.spec.secret,
                                          message_limit(self.sync.shapes[p]))
        except Unverified as exc:
            self.quarantine.add(ref.stream_id, f"unverified ({ref.island})", str(exc),
                                ref.island)
            return
        self._release(ref)
        facts = IslandFacts(liveness.epochs.get(ref.island, 0),
                            island.batch_size * config.model.block_size)
        try:
            update, norm = check_update(meta, tensors, ref, facts, self.sync.shapes[p],
                                        list(self.norms[p]))
        except Rejection as exc:
            self._reject(ref, str(exc))
            return
        if self.spec.elastic and update.base_version < self.restart_versions[p]:
            # Sent before a whole-job restart and read after it: thrown away with the
            # rollback (restart_job counted its steps), and its island no longer waits
            # for it. In a round it would stand for the island's first update after.
            self.sync.handled[p][ref.island] = max(ref.seq,
                                                   self.sync.handled[p].get(ref.island, -1))
            return
        reason = self.sync.submit(update, p, now)
        if reason is not None:
            self._reject(ref, reason)
            return
        self.norms[p].append(norm)
        self.round_refs[p].setdefault(ref.island, []).append(ref)
        previous = self.last_update.get((ref.island, p))
        # Within one epoch only: the gap across a kill and rejoin is down time.
        if previous is not None and previous[2] == ref.epoch and ref.seq > previous[1] \
                and now > previous[0]:
            steps = ref.seq - previous[1]
            self.step_time[ref.island] = (now - previous[0]) / steps
            training = now - previous[0] - (self.waited[ref.island]
                                            - self.waited_at.get((ref.island, p), 0.0))
            if training > 0:
                self.accounting.observe_step_time(ref.island, training / steps,
                                                  faulted=liveness.disturbed_since(
                                                      ref.island, previous[0]),
                                                  steps=steps)
        self.last_update[(ref.island, p)] = (now, ref.seq, ref.epoch)
        self.waited_at[(ref.island, p)] = self.waited[ref.island]

    def _reject(self, ref: UpdateRef, reason: str) -> None:
        """Refuse a verified update of the island it names (and settle its seq)."""
        log.warning("run %s: rejected update %s/%s seq %s from %s: %s", self.store.run_id,
                    ref.fragment, ref.epoch, ref.seq, ref.island, reason)
        self.rejections[ref.island] += 1
        self._account_lost_update(ref, reason)
        self.recorder.event("rejection", ref.island, reason=reason, fragment=ref.fragment,
                            seq=ref.seq, epoch=ref.epoch)
        p = ref.fragment
        if ref.island not in self.sync.rounds[p]:
            # The island may be waiting for this update's fate; it is settled.
            self.sync.handled[p][ref.island] = max(ref.seq,
                                                   self.sync.handled[p].get(ref.island, -1))
            if self.spec.elastic and ref.island in self.accounting.islands:
                # Behind a barrier the island waits for the round like the others (it
                # is told with the merge), so that no island runs a round ahead.
                self.excused[p].add(ref.island)
            elif p not in self.publishing:  # else written once that merge is published
                self.store.mark_handled(p, {ref.island: self.sync.handled[p][ref.island]})

    def _account_lost_update(self, ref: UpdateRef, reason: str) -> None:
        """The island-seconds behind a refused update: its steps since the island's
        previous handled update of that fragment, at its fault-free step time."""
        previous = self.sync.handled[ref.fragment].get(ref.island, ref.seq)
        step_time = self.accounting.step_time(ref.island) or 0.0
        cause = "stale" if reason.startswith("stale") else "rejected"
        self.accounting.lost(ref.island, step_time * max(ref.seq - previous, 0), cause)

    def sent_seqs(self, island: str) -> list[int]:
        """Per fragment, the seq of the island's last update syncd received (or, before
        it received one, the last it handled)."""
        sent = []
        for p in range(len(self.fragments)):
            last = self.last_update.get((island, p))
            sent.append(last[1] if last else self.sync.handled[p].get(island, 0))
        return sent

    def trim(self) -> None:
        """Forget the stream entries read: each was folded (and deleted then), refused,
        dropped or skipped."""
        major, minor = (int(x) for x in self.after.split(b"-"))
        if (major, minor) > (0, 0):
            self.store.trim_updates(self.after)

    # -- merges ----------------------------------------------------------------

    def round_stats(self) -> RoundStats:
        config = self.spec.config
        times = list(self.step_time.values()) or [1.0]
        fragment_bytes = max(sum(t.numel() * 4 for t in g.values()) for g in self.sync.globals)
        one_way = statistics.median(transfer_time(fragment_bytes, i.bandwidth_gbps,
                                                  i.latency_ms, config.emulation.bytes_scale)
                                    for i in config.islands)
        # t_sync is the round trip: the first sender spent its upload before it arrived,
        # and its overlap (tau steps) must cover that, the wait and the download. With
        # only the download the window ran past tau and islands waited (bench simulate:
        # 82.7% against 89.4% goodput at 1.2M chips, M = 8).
        return RoundStats(statistics.median(times), 2 * one_way)

    def barrier_size(self, p: int, alive: int) -> int:
        """Elastic: the updates fragment p's round waits for, every alive island's but
        the refused ones."""
        return max(alive - len(self.excused[p]), 1)

    def decide(self, p: int, now: float, alive: int) -> Decision:
        """Whether fragment p's round merges now: quorum and grace, or the barrier."""
        elastic = self.spec.elastic
        return self.sync.decide(p, now, self.barrier_size(p, alive) if elastic
                                else max(alive, 1), self.round_stats(), elastic)

    def maybe_merge(self, p: int, now: float, alive: int) -> bool:
        """Merge fragment p's open round if the policy says so, its publish begun
        (finish_merges ends it); True if the merge begun makes an outer step (every
        fragment merged once more). A merge the data plane refused is published again
        first, once FULL_RETRY_S have passed; no round of the fragment merges before it
        is."""
        if p in self.publishing:
            return False
        merge = self.unpublished[p]
        if merge is not None:
            if now < self.merge_after[p]:
                return False
            self._begin_publish(p)
            return merge.outer_step
        if not self.sync.rounds[p]:
            if self.excused[p] and len(self.excused[p]) >= alive:
                # Elastic, every alive island's update refused: nothing to merge.
                self.store.mark_handled(p, dict(self.sync.handled[p]))
                self.excused[p].clear()
            return False
        decision = self.decide(p, now, alive)
        return decision.merge and self.merge_round(p, now, decision.reason)

    def merge_round(self, p: int, now: float, reason: str) -> bool:
        """Merge fragment p's open round now (`reason`: why) and begin its publish
        (finish_merges ends it and accounts the merge); True if the merge makes an
        outer step."""
        self.excused[p].clear()
        if self.spec.elastic:
            for island, seconds in self.barrier_waits(p, now).items():
                self.waited[island] += seconds
                if island in self.accounting.islands:
                    self.accounting.lost(island, seconds, "barrier_wait")
        outer_steps = self.sync.outer_steps
        closed_at = max(pending.arrival_time for pending in self.sync.rounds[p].values())
        result = self.sync.merge(p, now)
        done = self.take_round(p)
        if result is None:
            self.store.mark_handled(p, dict(self.sync.handled[p]), done)
            return False
        if not self._finite(p):
            self._refuse_merge(p, result.version, list(result.inner_steps), done)
            return False
        merge = Unpublished(result, done, reason, closed_at, self.sync.outer_steps > outer_steps)
        self.unpublished[p] = merge
        self._begin_publish(p)
        return merge.outer_step

    def _begin_publish(self, p: int) -> None:
        """Publish fragment p's merge made in memory on syncd's publishing thread: its
        encoding, hash, writes to the data plane and to syncd's files wait on I/O or run
        outside the interpreter's lock, so the next round's updates are ingested
        meanwhile (ingest_while_publishing). One thread for every fragment, so that one
        full message at a time is in syncd's memory."""
        merge = self.unpublished[p]
        assert merge is not None
        handled = dict(self.sync.handled[p])
        commit = self._publication(p, merge.result.tokens, merge.done, handled,
                                   PUBLISH_DRAIN_S)
        if self._publisher is None:
            self._publisher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="publish")
        self.publishing[p] = Publication(self._publisher.submit(commit), handled)

    def ingest_while_publishing(self, liveness: Liveness) -> None:
        """Read the stream into the open rounds until every merge begun is published
        (or failed to be). Should the reading fail, the publishes are waited for
        before the error goes on: a run rebuilt from Redis after a failed pass (syncd's
        server does that) finds them committed, never still under way."""
        futures = [publication.future for publication in self.publishing.values()]

        def published() -> bool:
            return all(future.done() for future in futures)

        try:
            while not published():
                read_any, _ = self.ingest(self.clock(), liveness, until=published)
                if not read_any:
                    wait(futures, timeout=PUBLISHING_POLL_S)
                self.keepalive()
        finally:
            wait(futures)

    def finish_merges(self, now: float) -> int:
        """Wait for the merges being published and account each that was (its merge
        event, its goodput); returns how many outer steps they made. The data plane
        refusing one for memory leaves it unpublished, to be published again after
        FULL_RETRY_S (RunSync's watch of the data plane makes that an alert): the
        islands see nothing of it until then, its handled seqs are not written, and a
        syncd that dies meanwhile loses it as any merge in progress (the islands send
        its updates again). Handled seqs settled while a fragment's merge was being
        published are written once it is. A publish that failed otherwise stays
        unpublished too, and its error is raised once the others are accounted."""
        publishing, self.publishing = self.publishing, {}
        wait([publication.future for publication in publishing.values()])
        if self._publisher is not None:
            self._publisher.shutdown()
            self._publisher = None
        outer_steps = 0
        error: Exception | None = None
        for p, publication in sorted(publishing.items()):
            merge = self.unpublished[p]
            assert merge is not None
            try:
                self.bytes_saved += publication.future.result()
            except redis.OutOfMemoryError as exc:
                self.merge_after[p] = now + FULL_RETRY_S
                log.warning("run %s: the data plane refused the merge into version %d of "
                            "fragment %d (%s); published again in %.0f s", self.store.run_id,
                            merge.result.version, p, exc, FULL_RETRY_S)
                published = False
            except Exception as exc:  # raised below, once the others are accounted
                error = error or exc
                continue
            else:
                self.unpublished[p] = None
                published = True
            settled = {island: seq for island, seq in self.sync.handled[p].items()
                       if publication.handled.get(island) != seq}
            if settled:
                self.store.mark_handled(p, settled)
            if published:
                self._account_merge(p, merge, now)
                outer_steps += merge.outer_step
        if error is not None:
            raise error
        return outer_steps

    def _account_merge(self, p: int, merge: Unpublished, now: float) -> None:
        """Account fragment p's merge, published: goodput, its merge event."""
        result = merge.result
        self.keepalive()
        self.accounting.merged_round(result.weights, result.inner_steps, now, fragment=p,
                                     version=result.version, seqs=result.seqs)
        self.last_merge[p] = {"version": result.version, "weights": result.weights,
                              "reason": merge.reason}
        # From the pass that read the update closing the round to the merge committed.
        latency = round(max(self.clock() - merge.closed_at, 0.0), 4)
        self.recorder.event("merge", None, fragment=p, version=result.version,
                            weights=result.weights, tokens=result.tokens,
                            epochs={r.island: r.epoch for r in merge.done
                                    if r.island in result.weights},
                            seqs=result.seqs, reason=merge.reason, latency_s=latency)

    def _finite(self, p: int) -> bool:
        """Whether fragment p's global and outer momentum hold finite values only."""
        return all_finite([*self.sync.globals[p].values(),
                           *self.sync.optimizers[p].state_dict().values()])

    def _refuse_merge(self, p: int, version: int, islands: list[str],
                      done: list[UpdateRef]) -> None:
        """A merge into `version` that made fragment p non-finite (finite updates can
        overflow together): it is not published, the fragment goes back to its
        published version, and the round's updates are dropped as refused."""
        published = self.store.versions()[p]
        saved = self.files.load(p, published, self.store.fencing_tokens().get(p, 0))
        if saved is None:
            raise RuntimeError(f"fragment {p} version {published} is not in {self.files.folder}")
        _, meta, tensors = decode_message(saved[0], self.spec.verify_key)
        self.load_fragment(p, tensors, saved[1], meta["version"])
        history = self.sync.history[p]
        if history and history[-1].version == version:
            history.pop()
        self.store.mark_handled(p, dict(self.sync.handled[p]), done)
        reason = (f"the merge into version {version} of fragment {p} made it non-finite; "
                  f"not published, the updates of {', '.join(sorted(islands))} dropped")
        log.warning("run %s: %s", self.store.run_id, reason)
        for island in islands:
            self.rejections[island] += 1
            self.recorder.event("rejection", island, reason=reason, fragment=p)

    def barrier_waits(self, p: int, now: float) -> dict[str, float]:
        """Elastic: how long each island with an update in fragment p's round has waited
        at the barrier by `now`: since its update arrived, less the tau steps it goes on
        computing before it needs the merge."""
        tau = self.spec.config.sync.overlap_steps
        return {island: max(now - pending.arrival_time
                            - tau * (self.accounting.step_time(island) or 0.0), 0.0)
                for island, pending in self.sync.rounds[p].items()}

    def roll_back(self, p: int, params: dict[str, torch.Tensor],
                  momentum: dict[str, torch.Tensor], now: float, tokens: int) -> list[str]:
        """Elastic: put fragment p back to a restore point, published as its next version
        with `tokens` (the merged tokens taken back, negative); its open round is thrown
        away, and updates based before it are from now on. Returns the islands whose
        updates were in the round."""
        self.excused[p].clear()
        discarded = self.sync.roll_back(p, params, momentum, now)
        self.publish(p, tokens, self.take_round(p))
        self.restart_versions[p] = self.sync.versions[p]
        return discarded

