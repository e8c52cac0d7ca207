"""Reading a run's update stream into its open rounds in syncd.

`Ingester` reads the run's update stream and takes each entry alone: it skips an
update whose seq is already handled or pending (ingestion is idempotent, so nothing is
merged twice), verifies and checks the rest (syncd/ingest.py; an entry that speaks
for no island is quarantined, syncd/quarantine.py), refuses the updates that fail,
drops those sent before an elastic whole-job restart, and submits the others to the
run's Synchronizer, which folds each into its round's sum (diloco/fold.py). Its stream
entry and message are deleted as soon as it is verified. From the gaps between an
island's updates it measures the island's step time, for the policy and the goodput.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from diloco.synchronizer import Synchronizer
from syncd.ingest import (
    IslandFacts,
    Rejection,
    Unverified,
    check_update,
    message_limit,
    verify_update,
)
from syncd.quarantine import AGGREGATE_S, Quarantine
from syncd.store import RunStore
from syncd.update_stream import BadEntry, UpdateRef
from syncd.upload_slots import RunFacts, SlotKeeper, Ticket, crowded

# What parsing a hostile message may raise besides what its checks raise (a value of
# the wrong type, past any number, a tensor torch refuses): the entry's fault, never
# the tick's. Redis's errors are none of these: they fail the tick.
HOSTILE_ERRORS = (ValueError, TypeError, OverflowError, KeyError, IndexError, RuntimeError)

if TYPE_CHECKING:
    from diloco.accounting import RunAccounting
    from diloco.config import IslandConfig
    from syncd.hooks import Recorder
    from syncd.liveness import Liveness
    from syncd.spec import RunSpec

log = logging.getLogger("archipelago.syncd")
# Updates are ingested for at most this long in one pass, so that merges, the status
# and the leases of every run syncd serves keep their pace behind a backlog of big ones.
INGEST_BUDGET_S = 1.0
READ_COUNT = 256  # stream entries read per pass


class Ingester:
    """The stream read so far, the open rounds' entries, and what syncd measured of the
    updates.

    Args:
        store: the run's Redis keys.
        recorder: the run's rows (rejection events).
        spec: the run's spec.
        accounting: the run's goodput, told of step times and lost updates.
        sync: the run's Synchronizer, which the updates are submitted to.
        keepalive: called between the updates ingested.
        publishing: whether a fragment's merge is being published.
    """

    def __init__(self, store: RunStore, recorder: Recorder, spec: RunSpec,
                 accounting: RunAccounting, sync: Synchronizer,
                 keepalive: Callable[[], None], publishing: Callable[[int], bool]):
        self.store = store
        self.recorder = recorder
        self.spec = spec
        self.accounting = accounting
        self.sync = sync
        self.keepalive = keepalive
        self.publishing = publishing
        fragments = len(sync.fragments)
        self.after = b"0-0"
        # fragment -> island -> the stream entries of the updates in its open round
        # (several when increments were added up), already deleted: their epochs.
        self.round_refs: list[dict[str, list[UpdateRef]]] = [{} for _ in range(fragments)]
        self.norms = [deque(maxlen=32) for _ in range(fragments)]
        self.rejections: Counter[str] = Counter()
        self.quarantine = Quarantine(store.updates, recorder)
        self.slots = SlotKeeper()
        self.crowding: Counter[str] = Counter()  # island -> tickets taken off, not yet told
        self.next_crowding_event = 0.0
        # Elastic: islands whose update of the fragment's open round was refused; the
        # barrier does not wait for them (a skipped bad step).
        self.excused: list[set[str]] = [set() for _ in range(fragments)]
        self.restart_versions = [0] * fragments  # published by the last restart
        self.step_time: dict[str, float] = {}
        # time, seq, epoch, and the backpressure wait the island's heartbeat reported then
        self.last_update: dict[tuple[str, int], tuple[float, int, int, float]] = {}
        # Elastic: each island's barrier waits booked as lost so far, and their total at
        # its last update of each fragment: a step time counts them once, as lost.
        self.waited: Counter[str] = Counter()
        self.waited_at: dict[tuple[str, int], float] = {}

    # -- what the rounds tell it -----------------------------------------------

    def take_round(self, p: int) -> list[UpdateRef]:
        """Forget fragment p's open round here: the stream entries of its updates, whose
        messages the next publish or mark deletes."""
        refs = [ref for island_refs in self.round_refs[p].values() for ref in island_refs]
        self.round_refs[p] = {}
        return refs

    def clear_excused(self, p: int) -> None:
        """Fragment p's round closed: the barrier of the next waits for every island."""
        self.excused[p].clear()

    def waited_at_barrier(self, island: str, seconds: float) -> None:
        """Elastic: the island waited this long at a barrier, booked as lost."""
        self.waited[island] += seconds

    def restarted(self, p: int, version: int) -> None:
        """Elastic: a whole-job restart published fragment p's `version`; updates based
        before it are thrown away."""
        self.restart_versions[p] = version

    def refuse_merged(self, p: int, islands: list[str], reason: str) -> None:
        """The islands' updates, merged into fragment p, were dropped (`reason`)."""
        for island in islands:
            self.rejections[island] += 1
            self.recorder.event("rejection", island, reason=reason, fragment=p)

    # -- the stream ------------------------------------------------------------

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
        while entries := self.store.updates.read_updates(self.after, count=READ_COUNT):
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
        self._free_crowded(now, facts.islands)
        slots = self.spec.config.sync.upload_slots
        while stale := self.slots.stale(holders := self.store.updates.slot_holders(slots),
                                        now, facts, self.store.updates.written(holders)):
            log.warning("run %s: freed %d upload slots held by %s", self.store.run_id,
                        len(stale), [raw.decode(errors="replace")[:80] for raw in stale])
            self.store.updates.free_slots(stale)

    def _free_crowded(self, now: float, islands: set[str]) -> None:
        """Take off the queue every ticket of an island with more than one whose update
        is not written (syncd.upload_slots.crowded: queued in its name by another), one
        rejection event per island at most every AGGREGATE_S with the count."""
        queue = self.store.updates.queued()
        for island, tickets in crowded(queue, self.store.updates.written(queue),
                                       islands).items():
            self.store.updates.free_slots(tickets)
            self.crowding[island] += len(tickets)
        if not self.crowding or now < self.next_crowding_event:
            return
        self.next_crowding_event = now + AGGREGATE_S
        for island, count in self.crowding.items():
            log.warning("run %s: took off %d upload tickets in island %s's name",
                        self.store.run_id, count, island)
            self.recorder.event("rejection", island, cause="tickets_crowded", deleted=count,
                                reason="upload tickets in the island's name beyond the one "
                                       "it may queue before its update is written")
        self.crowding.clear()

    def _release(self, ref: UpdateRef) -> None:
        """Delete a verified update's stream entry and message (syncd holds it now) and
        free its upload slot: the next island in line writes while this one is checked
        and folded. Entry and message go together, so a restarted syncd never reads an
        entry whose message is gone (it would quarantine a genuine update as
        unverified); should syncd die before the fold, the island sends it again
        (trainer/resend.py). An entry that is not verified frees nothing: it is not
        shown to speak for the island whose message and slot it names (but one that
        names an update handled already: that message and ticket are of no use)."""
        self.store.updates.forget_updates([ref])
        ticket = Ticket(ref.island, ref.epoch, ref.fragment, ref.seq)
        self.store.updates.free_slots([ticket.encode()])

    def _handled_seq(self, island: str, fragment: int) -> int:
        if not 0 <= fragment < len(self.sync.fragments):
            return -1
        return self.sync.handled_seq(fragment, island)

    def _ingest(self, ref: UpdateRef, now: float, liveness: Liveness) -> None:
        p = ref.fragment
        island = self._sender(ref)
        if island is None:
            return
        if self._done_with(ref):
            # Merged at most once: an update sent again (the same seq, the same message)
            # is the same update, and one before it is done with. Nothing is done in
            # its name (the entry is not verified) but delete the message it names and
            # free its slot, which syncd needs no more.
            self._release(ref)
            return
        verified = self._verified(ref)
        if verified is None:
            return
        self._release(ref)
        meta, tensors = verified
        facts = IslandFacts(liveness.epochs.get(ref.island, 0),
                            island.batch_size * self.spec.config.model.block_size)
        try:
            update, norm = check_update(meta, tensors, ref, facts, self.sync.shapes[p],
                                        list(self.norms[p]))
        except (Rejection, *HOSTILE_ERRORS) as exc:  # what it signed, refused, not the tick
            self._reject(ref, str(exc)[:500])
            return
        if self.spec.elastic and update.base_version < self.restart_versions[p]:
            # Sent before a whole-job restart and read after it: thrown away with the
            # rollback (restart_job counted its steps), and its island no longer waits
            # for it. In a round it would stand for the island's first update after.
            self.sync.settle(p, ref.island, ref.seq)
            return
        reason = self.sync.submit(update, p, now)
        if reason is not None:
            self._reject(ref, reason)
            return
        self.norms[p].append(norm)
        self.round_refs[p].setdefault(ref.island, []).append(ref)
        self._measure(ref, now, liveness)

    def _sender(self, ref: UpdateRef) -> IslandConfig | None:
        """The island of the run that the entry names, of a fragment the run has; None,
        the entry quarantined, if it names none."""
        island = next((i for i in self.spec.config.islands if i.name == ref.island), None)
        if island is None:
            self.quarantine.add(ref.stream_id, "unknown island",
                                f"unknown island {ref.island[:64]!r}", None)
            return None
        if not 0 <= ref.fragment < len(self.sync.fragments):
            self.quarantine.add(ref.stream_id, f"no such fragment ({ref.island})",
                                f"no fragment {ref.fragment}", ref.island)
            return None
        return island

    def _done_with(self, ref: UpdateRef) -> bool:
        """Whether the entry's update is handled already or pending in its round."""
        return self.sync.done_with(ref.fragment, ref.island, ref.seq)

    def _verified(self, ref: UpdateRef) -> tuple[dict[str, Any], dict[str, torch.Tensor]] | None:
        """The entry's update, verified (syncd.ingest.verify_update); None, the entry
        quarantined, if it is not."""
        try:
            return verify_update(lambda limit: self.store.updates.update_message(ref, limit),
                                 ref, self.spec.secret,
                                 message_limit(self.sync.shapes[ref.fragment]))
        except (Unverified, *HOSTILE_ERRORS) as exc:
            self.quarantine.add(ref.stream_id, f"unverified ({ref.island})", str(exc)[:500],
                                ref.island)
            return None

    def _measure(self, ref: UpdateRef, now: float, liveness: Liveness) -> None:
        """The island's step time from the gap since its last update of the fragment.
        The step time that sizes rounds (a period's end, the grace window) leaves out
        the backpressure the island's heartbeats report meanwhile: a period sized by
        waits would hold the next merge later, which holds the islands back longer, and
        the period never shrinks back to the training pace."""
        p = ref.fragment
        previous = self.last_update.get((ref.island, p))
        beat = liveness.heartbeats.get(ref.island)
        held = beat.backpressure_wait_s if beat is not None and beat.epoch == ref.epoch else 0.0
        # Within one epoch only: the gap across a kill and rejoin is down time.
        if previous is not None and previous[2] == ref.epoch and ref.seq > previous[1] \
                and now > previous[0]:
            steps = ref.seq - previous[1]
            training = now - previous[0] - (self.waited[ref.island]
                                            - self.waited_at.get((ref.island, p), 0.0))
            paced = training - max(held - previous[3], 0.0)
            self.step_time[ref.island] = (paced if paced > 0 else now - previous[0]) / steps
            if training > 0:
                self.accounting.observe_step_time(ref.island, training / steps,
                                                  faulted=liveness.disturbed_since(
                                                      ref.island, previous[0]),
                                                  steps=steps)
        self.last_update[(ref.island, p)] = (now, ref.seq, ref.epoch, held)
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
        if ref.island not in self.sync.open_round(p):
            # The island may be waiting for this update's fate; it is settled.
            self.sync.settle(p, ref.island, ref.seq)
            if self.spec.elastic and ref.island in self.accounting.islands:
                # Behind a barrier the island waits for the round like the others (it
                # is told with the merge), so that no island runs a round ahead.
                self.excused[p].add(ref.island)
            elif not self.publishing(p):  # else written once that merge is published
                self.store.globals.mark_handled(
                    p, {ref.island: self.sync.handled_seq(p, ref.island)})

    def _account_lost_update(self, ref: UpdateRef, reason: str) -> None:
        """The island-seconds behind a refused update: its steps since the island's
        previous handled update of that fragment, at its fault-free step time."""
        previous = self.sync.handled_seq(ref.fragment, ref.island, default=ref.seq)
        step_time = self.accounting.step_time(ref.island) or 0.0
        cause = "stale" if reason.startswith("stale") else "rejected"
        self.accounting.lost(ref.island, step_time * max(ref.seq - previous, 0), cause)

    def sent_seqs(self, island: str) -> list[int]:
        """Per fragment, the seq of the island's last update syncd received (or, before
        it received one, the last it handled)."""
        sent = []
        for p in range(len(self.sync.fragments)):
            last = self.last_update.get((island, p))
            sent.append(last[1] if last else self.sync.handled_seq(p, island, default=0))
        return sent

    def trim(self) -> None:
        """Forget the stream entries read: each was folded (and deleted then), refused,
        dropped or skipped."""
        major, minor = (int(x) for x in self.after.split(b"-"))
        if (major, minor) > (0, 0):
            self.store.updates.trim_updates(self.after)
