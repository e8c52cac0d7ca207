"""The rounds of a run in syncd: updates read from the stream, checked, merged and
published.

`Rounds` holds the run's Synchronizer (the same class the in-process cluster uses)
and its two collaborators: the `Ingester` (syncd/ingester.py) feeds it from the run's
update stream, and the `Publisher` (syncd/publisher.py) publishes its merges. Each
update is folded into its round's sum as it is ingested (diloco/fold.py), and its
message and stream entry are deleted right after: syncd holds one running sum per
open fragment round, whatever the number of islands. A merge is made on syncd's
thread and published on a thread of its own while the next round's updates are read
(`maybe_merge`, `ingest_while_publishing`, `Publisher.finish`); it is acknowledged
once GlobalsStore.publish has committed it. The versions and handled seqs are in the
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
from collections.abc import Callable
from concurrent.futures import wait
from typing import TYPE_CHECKING, Any

import torch

from diloco.fragments import Fragment
from diloco.island import embedding_tensors
from diloco.link_times import LinkCounts, LinkTimes, SyncTime
from diloco.policy import Decision, RoundStats
from diloco.protocol import ProtocolError, decode_message
from diloco.synchronizer import Synchronizer
from diloco.wan import transfer_time
from syncd.bulk import BulkError
from syncd.ingest import all_finite
from syncd.ingester import Ingester
from syncd.published_files import PublishedFiles
from syncd.publisher import Publisher, Unpublished
from syncd.store import RunStore
from syncd.update_stream import UpdateRef

if TYPE_CHECKING:
    from diloco.accounting import RunAccounting
    from syncd.hooks import Recorder
    from syncd.liveness import Liveness
    from syncd.records import Heartbeat
    from syncd.spec import RunSpec

log = logging.getLogger("archipelago.syncd")
# While merges are published, the stream is read again at most this long after it was
# found empty.
PUBLISHING_POLL_S = 0.01


class Rounds:
    """The open rounds and the globals of a run, and when they merge.

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
        self.recorder = recorder
        self.spec = spec
        self.accounting = accounting
        self.clock = clock
        self.keepalive = keepalive
        config = spec.config
        self.fragments = fragments
        self.sync = Synchronizer(params, fragments, config.sync, config.optim,
                                 config.round_tokens(), embedding_tensors(config, list(params)))
        self.publisher = Publisher(store, recorder, spec, accounting, self.sync, clock,
                                   keepalive, files)
        self.ingester = Ingester(store, recorder, spec, accounting, self.sync, keepalive,
                                 lambda p: p in self.publisher.publishing)
        self.link_times = LinkTimes()
        # fragment -> when its open round is decided again, if it waits on the clock (its
        # grace window, a publish to try again): a quiet syncd wakes then (`wake_at`).
        self.deadlines: dict[int, float] = {}

    # -- state in Redis --------------------------------------------------------

    def follow_spec(self) -> None:
        """The spec changed: a round's tokens are the new islands'."""
        self.sync.use_round_tokens(self.spec.config.round_tokens())

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
        tokens = self.store.globals.fencing_tokens()
        for p, version in versions.items():
            full = None
            if self.store.served is None:
                with contextlib.suppress(BulkError):
                    full = self.store.globals.full(p)
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
                self.publisher.commit_full(p, 0, self.publisher.global_message(p, 0), {})
                continue
            full, meta, tensors, momentum = found.pop(p)
            self.sync.load(p, tensors, momentum, meta["version"])
            self.sync.restore_handled(p, self.store.globals.handled(p))
            if p in again:  # committed again by this grant: in this grant's file too
                self.publisher.commit_full(p, meta["version"], [memoryview(full)], momentum)
            else:
                self.store.globals.keep_published(p, self.publisher.kept_versions(p))
            self.keepalive()
        if versions:
            log.info("run %s restored at versions %s%s", self.store.run_id, self.sync.versions(),
                     f" (fragments {sorted(again)} from {self.files.folder})" if again else "")
        return True

    def tokens_merged(self) -> int:
        """Tokens merged into the model: each fragment's, on average."""
        per_fragment = self.store.globals.tokens_merged()
        return sum(per_fragment.values()) // len(self.fragments)

    # -- merges ----------------------------------------------------------------

    def observe_links(self, heartbeats: dict[str, Heartbeat], lost: set[str]) -> None:
        """Take the living islands' link counts from their heartbeats (t_sync follows
        them) and forget the lost ones'."""
        for island in lost:
            self.link_times.forget(island)
        for island, beat in heartbeats.items():
            if island not in lost:
                self.link_times.observe(island, LinkCounts(beat.epoch, beat.sends,
                                                           beat.send_link_s, beat.pulls,
                                                           beat.pull_link_s))

    def sync_time(self) -> SyncTime:
        """t_sync, the round trip: the islands' measured send plus pull
        (diloco/link_times.py), the config's estimate until both are measured (twice
        the median island's one-way time of the largest fragment). The first sender
        spent its upload before it arrived, and its overlap (tau steps) must cover that,
        the wait and the download. With only the download the window ran past tau and
        islands waited (bench simulate: 82.7% against 89.4% goodput at 1.2M chips,
        M = 8)."""
        config = self.spec.config
        fragment_bytes = max(sum(t.numel() * 4 for t in g.values()) for g in self.sync.globals)
        one_way = statistics.median(transfer_time(fragment_bytes, i.bandwidth_gbps,
                                                  i.latency_ms, config.emulation.bytes_scale)
                                    for i in config.islands)
        return self.link_times.sync_time(2 * one_way)

    def round_stats(self) -> RoundStats:
        times = list(self.ingester.step_time.values()) or [1.0]
        return RoundStats(statistics.median(times), self.sync_time().seconds,
                          dict(self.ingester.step_time))

    def barrier_size(self, p: int, alive: int) -> int:
        """Elastic and sync: the updates fragment p's round waits for, every alive island's
        but the refused ones (elastic's only)."""
        return max(alive - len(self.ingester.excused[p]), 1)

    def decide(self, p: int, now: float, alive: int,
               sending: frozenset[str] | None = None) -> Decision:
        """Whether fragment p's round merges now: quorum and grace, the barrier (elastic
        and sync: every alive island), or, where syncd chose tau 0, the islands sending
        (`sending`, alive and past their start) that train or send this fragment next,
        up to a period (Synchronizer.decide)."""
        barrier = self.spec.barrier
        if sending is not None and not barrier:
            return self.sync.decide(p, now, max(alive, 1), self.round_stats(), waiting=sending)
        return self.sync.decide(p, now, self.barrier_size(p, alive) if barrier
                                else max(alive, 1), self.round_stats(), barrier)

    def maybe_merge(self, p: int, now: float, alive: int,
                    sending: frozenset[str] | None = None) -> bool:
        """Merge fragment p's open round if the policy says so, its publish begun
        (Publisher.finish ends it); True if the merge begun makes an outer step (every
        fragment merged once more). A merge the data plane refused is published again
        first, once FULL_RETRY_S (syncd/publisher.py) have passed; no round of the
        fragment merges before it is. `sending`: as in `decide`."""
        self.deadlines.pop(p, None)
        if p in self.publisher.publishing:
            return False
        merge = self.publisher.unpublished[p]
        if merge is not None:
            if now < self.publisher.merge_after[p]:
                self.deadlines[p] = self.publisher.merge_after[p]
                return False
            self.publisher.begin(p, merge)
            return merge.outer_step
        if not self.sync.open_round(p):
            if self.ingester.excused[p] and len(self.ingester.excused[p]) >= alive:
                # Elastic, every alive island's update refused: nothing to merge.
                self.store.globals.mark_handled(p, self.sync.handled(p))
                self.ingester.clear_excused(p)
            return False
        decision = self.decide(p, now, alive, sending)
        if decision.deadline is not None:
            self.deadlines[p] = decision.deadline
        return decision.merge and self.merge_round(p, now, decision.reason)

    def wake_at(self) -> float | None:
        """The soonest time an open round is decided again on the clock, None if none
        waits on it."""
        return min(self.deadlines.values(), default=None)

    def merge_round(self, p: int, now: float, reason: str) -> bool:
        """Merge fragment p's open round now (`reason`: why) and begin its publish
        (Publisher.finish ends it and accounts the merge); True if the merge makes an
        outer step."""
        self.ingester.clear_excused(p)
        if self.spec.elastic:
            for island, seconds in self.barrier_waits(p, now).items():
                self.ingester.waited_at_barrier(island, seconds)
                if island in self.accounting.islands:
                    self.accounting.lost(island, seconds, "barrier_wait")
        outer_steps = self.sync.outer_steps
        closed_at = max(pending.arrival_time for pending in self.sync.open_round(p).values())
        result = self.sync.merge(p, now)
        done = self.ingester.take_round(p)
        if result is None:
            self.store.globals.mark_handled(p, self.sync.handled(p), done)
            return False
        if not self._finite(p):
            self._refuse_merge(p, result.version, list(result.inner_steps), done)
            return False
        merge = Unpublished(result, done, reason, closed_at, self.sync.outer_steps > outer_steps)
        self.publisher.begin(p, merge)
        return merge.outer_step

    def ingest_while_publishing(self, liveness: Liveness) -> None:
        """Read the stream into the open rounds until every merge begun is published
        (or failed to be). Should the reading fail, the publishes are waited for
        before the error goes on: a run rebuilt from Redis after a failed pass (syncd's
        server does that) finds them committed, never still under way."""
        futures = [publication.future for publication in self.publisher.publishing.values()]

        def published() -> bool:
            return all(future.done() for future in futures)

        try:
            while not published():
                read_any, _ = self.ingester.ingest(self.clock(), liveness, until=published)
                if not read_any:
                    wait(futures, timeout=PUBLISHING_POLL_S)
                self.keepalive()
        finally:
            wait(futures)

    def _finite(self, p: int) -> bool:
        """Whether fragment p's global and outer momentum hold finite values only."""
        return all_finite([*self.sync.globals[p].values(),
                           *self.sync.optimizers[p].state_dict().values()])

    def _refuse_merge(self, p: int, version: int, islands: list[str],
                      done: list[UpdateRef]) -> None:
        """A merge into `version` that made fragment p non-finite (finite updates can
        overflow together): it is not published, the fragment goes back to its
        published version, and the round's updates are dropped as refused."""
        published = self.store.globals.versions()[p]
        saved = self.files.load(p, published, self.store.globals.fencing_tokens().get(p, 0))
        if saved is None:
            raise RuntimeError(f"fragment {p} version {published} is not in {self.files.folder}")
        _, meta, tensors = decode_message(saved[0], self.spec.verify_key)
        self.sync.load(p, tensors, saved[1], meta["version"])
        self.sync.forget_published(p, version)
        self.store.globals.mark_handled(p, self.sync.handled(p), done)
        reason = (f"the merge into version {version} of fragment {p} made it non-finite; "
                  f"not published, the updates of {', '.join(sorted(islands))} dropped")
        log.warning("run %s: %s", self.store.run_id, reason)
        self.ingester.refuse_merged(p, islands, reason)

    def barrier_waits(self, p: int, now: float) -> dict[str, float]:
        """Elastic: how long each island with an update in fragment p's round has waited
        at the barrier by `now`: since its update arrived, less the tau steps it goes on
        computing before it needs the merge."""
        tau = self.spec.config.sync.overlap_steps
        return {island: max(now - pending.arrival_time
                            - tau * (self.accounting.step_time(island) or 0.0), 0.0)
                for island, pending in self.sync.open_round(p).items()}

    def roll_back(self, p: int, params: dict[str, torch.Tensor],
                  momentum: dict[str, torch.Tensor], now: float, tokens: int) -> list[str]:
        """Elastic: put fragment p back to a restore point, published as its next version
        with `tokens` (the merged tokens taken back, negative); its open round is thrown
        away, and updates based before it are from now on. Returns the islands whose
        updates were in the round."""
        self.ingester.clear_excused(p)
        discarded = self.sync.roll_back(p, params, momentum, now)
        self.publisher.publish(p, tokens, self.ingester.take_round(p))
        self.ingester.restarted(p, self.sync.version(p))
        return discarded

