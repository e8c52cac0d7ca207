"""Publishing a run's merges in syncd: the publishing thread and its retries.

A merge made in syncd's memory (`syncd.rounds.Rounds.merge_round`) is published on a
thread of its own while the next round's updates are read (`Publisher.begin`, then
`Rounds.ingest_while_publishing`, then `Publisher.finish`); it is acknowledged once
GlobalsStore.publish has committed it. Each commit first makes the version durable in
syncd's files (syncd.published_files, written once per merge, with its outer
momentum), so a data plane that restarts loses no merge. A merge the data plane
refuses for memory stays in syncd's memory, unpublished, and is published again
FULL_RETRY_S later.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis
import torch

from diloco.protocol import encode_message, encode_pieces
from diloco.staleness import Staleness
from diloco.synchronizer import MergeResult, Synchronizer, history_length
from syncd.published_files import PublishedFiles
from syncd.store import RunStore
from syncd.update_stream import UpdateRef

if TYPE_CHECKING:
    from diloco.accounting import RunAccounting
    from syncd.hooks import Recorder
    from syncd.spec import RunSpec

log = logging.getLogger("archipelago.syncd")
# A merge the data plane refused for memory is published again after this long.
FULL_RETRY_S = 1.0
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


class Publisher:
    """The commits of a run's fragments, and the merges being published.

    Args:
        store: the run's Redis keys.
        recorder: the run's rows (merge events).
        spec: the run's spec.
        accounting: the run's goodput, told of each merge published.
        sync: the run's Synchronizer, whose fragments are published.
        clock: the time source (seconds).
        keepalive: called between the pieces of long work.
        files: where each fragment's newest version is durable (syncd.published_files).
    """

    def __init__(self, store: RunStore, recorder: Recorder, spec: RunSpec,
                 accounting: RunAccounting, sync: Synchronizer, clock: Callable[[], float],
                 keepalive: Callable[[], None], files: PublishedFiles):
        self.store = store
        self.recorder = recorder
        self.spec = spec
        self.accounting = accounting
        self.sync = sync
        self.clock = clock
        self.keepalive = keepalive
        self.files = files
        self.bytes_saved = 0  # written to `files`, for the benchmarks
        fragments = len(sync.fragments)
        self.last_merge: list[dict[str, Any]] = [{} for _ in range(fragments)]
        self.staleness = Staleness()  # the ages of the updates merged, per island
        # fragment -> when a merge the data plane refused for memory is published again,
        # and that merge (made in syncd's memory, not yet acknowledged)
        self.merge_after = [0.0] * fragments
        self.unpublished: list[Unpublished | None] = [None] * fragments
        # fragment -> its merge being published (begun by `begin`, ended by `finish`)
        self.publishing: dict[int, Publication] = {}
        self._publisher: ThreadPoolExecutor | None = None

    @property
    def kept_differences(self) -> int:
        """Published differences kept in Redis per fragment: as far back as an island
        may lag (max_staleness); none without a lossy downlink."""
        return history_length(self.spec.config.sync)

    def kept_versions(self, p: int) -> range:
        """The versions whose published differences of fragment p may still be read."""
        version = self.sync.version(p)
        return range(max(version - self.kept_differences + 1, 1), version + 1)

    def global_message(self, p: int, version: int,
                       tensors: dict[str, torch.Tensor] | None = None) -> list[memoryview]:
        """Fragment p's full message at `version` of these tensors (its global's), as
        pieces that are views of them (diloco.protocol.encode_pieces): nothing the size
        of the fragment is copied."""
        meta = {"run": self.store.run_id, "fragment": p, "version": version, "base_version": -1,
                "codec": "none"}
        return encode_pieces("global", meta, self.sync.globals[p] if tensors is None
                             else tensors, self.spec.publish_key)

    def commit_full(self, p: int, version: int, full: list[memoryview],
                    momentum: dict[str, torch.Tensor]) -> None:
        """Commit fragment p's `version` as this full message with this outer momentum,
        with no tokens, handled seqs or difference: a version syncd holds already."""
        self.bytes_saved += self._commit(p, version, full, None, momentum, 0, {})

    def republish(self) -> None:
        """The data plane lost the run's messages (it restarted): publish every
        fragment's version again from what syncd holds, a commit of this grant's, so in
        its files too. The differences of a lossy downlink are gone; an island behind
        takes the full fragment."""
        for p in range(len(self.sync.fragments)):
            version = self.sync.version(p)
            self.commit_full(p, version, self.global_message(p, version),
                             self.sync.optimizers[p].state_dict())
            self.keepalive()
        self.store.globals.mark_dataplane()

    def publish(self, p: int, result_tokens: int, done: list[UpdateRef] = ()) -> None:
        """Commit fragment p's newest version; `done` are the updates it took in (or
        threw away), whose messages go in the same transaction."""
        self.bytes_saved += self._publication(p, result_tokens, done,
                                              self.sync.handled(p))()

    def _publication(self, p: int, tokens: int, done: list[UpdateRef],
                     handled: dict[str, int], drain_s: float = 0.0) -> Callable[[], int]:
        """What commits fragment p's newest version with these handled seqs, with what
        it reads taken now: it may run on another thread while this one ingests, and
        fragment p merges no more until it has run. Returns the bytes written to
        syncd's files."""
        version = self.sync.version(p)
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
            full = self.global_message(p, version, tensors)
            return self._commit(p, version, full, difference, momentum, tokens, handled, done,
                                drain_s)

        return commit

    def _commit(self, p: int, version: int, full: list[memoryview], difference: bytes | None,
                momentum: dict[str, torch.Tensor], tokens: int, handled: dict[str, int],
                done: list[UpdateRef] = (), drain_s: float = 0.0) -> int:
        """Make fragment p's `version` durable in syncd's files, then commit it
        (GlobalsStore.publish): a data plane that restarts loses no merge. The file is
        written on a thread of its own while the messages go to the data plane (both
        wait on I/O, not on the interpreter), and the commit waits for it; it is this
        grant's file (its fencing token), and once committed the other grants' files
        of p go. Returns the bytes written to the files."""
        token = self.store.fencing_token
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="published-files") as pool:
            saving = pool.submit(self.files.save, p, version, token, full, momentum)
            with self.store.updates.slot_for_publish(p, version, self.spec.config.sync.upload_slots,
                                                     drain_s):
                self.store.globals.publish(p, version, full, difference, handled, tokens,
                                           self.kept_differences, done, before_commit=saving.result)
        self.files.keep_only(p, token)
        return saving.result()

    def begin(self, p: int, merge: Unpublished) -> None:
        """Publish fragment p's merge made in memory on syncd's publishing thread: its
        encoding, hash, writes to the data plane and to syncd's files wait on I/O or run
        outside the interpreter's lock, so the next round's updates are ingested
        meanwhile (Rounds.ingest_while_publishing). One thread for every fragment, so
        that one full message at a time is in syncd's memory. The merge stays
        unpublished until `finish` finds it published."""
        self.unpublished[p] = merge
        handled = self.sync.handled(p)
        commit = self._publication(p, merge.result.tokens, merge.done, handled,
                                   PUBLISH_DRAIN_S)
        if self._publisher is None:
            self._publisher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="publish")
        self.publishing[p] = Publication(self._publisher.submit(commit), handled)

    def finish(self, now: float) -> int:
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
            settled = {island: seq for island, seq in self.sync.handled(p).items()
                       if publication.handled.get(island) != seq}
            if settled:
                self.store.globals.mark_handled(p, settled)
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
        self.staleness.merged(result.ages)
        self.last_merge[p] = {"version": result.version, "weights": result.weights,
                              "ages": result.ages, "reason": merge.reason}
        # From the pass that read the update closing the round to the merge committed.
        latency = round(max(self.clock() - merge.closed_at, 0.0), 4)
        self.recorder.event("merge", None, fragment=p, version=result.version,
                            weights=result.weights, tokens=result.tokens,
                            epochs={r.island: r.epoch for r in merge.done
                                    if r.island in result.weights},
                            seqs=result.seqs, ages=result.ages, reason=merge.reason,
                            latency_s=latency)
