"""The island's pulling: the newest global fragments into its island, read over the
emulated link, and the counts of what it pulled that its heartbeats carry.

Its first pull takes every fragment whole while the island is built (`pull_all`);
from then on each merged fragment is downloaded on a thread of its own
(trainer/downloads.py) and mixed in at the step the training loop says (`mix`); an
elastic whole-job restart takes every fragment whole again (`reset_all`).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from diloco.island import Island
from diloco.protocol import decode_message
from diloco.synchronizer import Published
from syncd.bulk import BulkError
from syncd.globals_store import GlobalsStore
from syncd.malloc import fault_in
from trainer.distributed import IslandGroup
from trainer.downloads import RETRY_S, Downloads, GlobalMissing, NotReadable
from trainer.emulation import FaultEmulation

log = logging.getLogger("archipelago.island")
# Fragments of the first pull read ahead of the one the island takes in: the reads go
# on while the island is built and its first step's memory faulted in, two fragments'
# messages at most beside the island (diloco/sizes.py counts 2F for a pull).
PULL_AHEAD = 2


def read_full(store: GlobalsStore, p: int, stopping: Callable[[], bool]) -> bytearray | None:
    """The newest full message of fragment p, read again every RETRY_S while it cannot be
    read (the syncd whose server its reference names is gone, until the next one
    publishes it again), unless the island stops."""
    while True:
        try:
            return store.full(p)
        except BulkError as exc:
            if stopping():
                raise SystemExit(0) from None
            log.warning("fragment %d could not be read (%s); trying again", p, exc)
            time.sleep(RETRY_S)


class Pulling:
    """What an island pulls of the run's globals, and how much.

    Args:
        store: the run's published globals (`RunStore.globals`).
        name: the island's name in the run config.
        verify_key: the run's publish key's verifying half: a global signed with any
            other is refused before a tensor is read.
        downlink_compression: the run's sync.downlink_compression ("none": whole
            fragments only, no differences).
        emulation: the island's faults and emulated link.
        group: the island's processes, when it has several; this is rank 0.
        stopping: whether the island stops.
        stop: stops the island (the run ended and its state went with it).
        run_ended: whether the run is over for good.
    """

    def __init__(self, store: GlobalsStore, name: str, verify_key: Ed25519PublicKey,
                 downlink_compression: str, emulation: FaultEmulation,
                 group: IslandGroup | None, stopping: Callable[[], bool],
                 stop: Callable[[], None], run_ended: Callable[[], bool]):
        self.store = store
        self.name = name
        self.verify_key = verify_key
        self.downlink_compression = downlink_compression
        self.emulation = emulation
        self.group = group
        self.stopping = stopping
        self.stop = stop
        self.run_ended = run_ended
        self.island: Island | None = None  # built during pull_all
        self.bytes_down = 0
        self.pulls = 0
        self.pull_link_s = 0.0  # the pulls' transfers, the emulated link's hold included
        self.pull_s = 0.0  # reading, checking and mixing pulled fragments, in all
        self.pull_wait_s = 0.0  # of it, on the training thread (mixes, blocking waits)
        self.late_globals = 0  # merged fragments mixed after their tau overlap steps
        self.downloads = Downloads(self.fetch, self.handled, emulation.transfer_time,
                                   emulation.wait_while_partitioned, stopping)

    def handled(self, p: int, seq: int) -> bool:
        """Whether syncd merged or dropped this island's update `seq` of fragment p."""
        return self.store.handled_seq(p, self.name) >= seq

    def full(self, p: int) -> tuple[int, dict[str, torch.Tensor]]:
        """The newest global fragment p, read chunk by chunk into one buffer whose views
        are the tensors (no further copy), over the emulated link as every later pull
        is: not while it is cut, and in the larger of the real read and the link's time."""
        self.emulation.wait_while_partitioned()
        started = time.monotonic()
        blob = read_full(self.store, p, self.stopping)
        if blob is None:
            if self.run_ended():
                self.stop()  # the run ended and its state went with it
                raise SystemExit(0)
            raise RuntimeError(f"global fragment {p} is missing from Redis")
        self.bytes_down += len(blob)
        _, meta, tensors = decode_message(blob, self.verify_key)
        link_s = self.emulation.transfer_time(len(blob))
        time.sleep(max(0.0, link_s - (time.monotonic() - started)))
        return meta["version"], tensors

    def fetch(self, p: int, version: int) -> tuple[int, list[Published], int]:
        """Fragment p's published messages newer than `version`: (the newest version,
        the messages, bytes read). On the downloads thread (trainer/downloads.py).

        Raises:
            GlobalMissing: the newest global fragment p is not in Redis.
            NotReadable: its message cannot be read now (syncd's server is gone).
        """
        try:
            return self._fetch(p, version)
        except BulkError as exc:
            log.warning("fragment %d could not be read (%s); trying again", p, exc)
            raise NotReadable(str(exc)) from exc

    def _fetch(self, p: int, version: int) -> tuple[int, list[Published], int]:
        newest = self.store.versions().get(p, version)
        if newest <= version:
            return version, [], 0
        blobs = []
        if self.downlink_compression != "none":
            blobs = self.store.differences(p, range(version + 1, newest + 1))
        if blobs and all(b is not None for b in blobs):
            published = []
            for blob in blobs:
                _, meta, tensors = decode_message(blob, self.verify_key)
                published.append(Published(meta["version"], 0.0, meta["codec"], tensors))
            return published[-1].version, published, sum(len(b) for b in blobs)
        blob = self.store.full(p)
        if blob is None:
            raise GlobalMissing(f"global fragment {p} is missing from Redis")
        _, meta, tensors = decode_message(blob, self.verify_key)
        return meta["version"], [Published(meta["version"], 0.0, "none", tensors)], len(blob)

    def pull_all(self, n: int, build: Callable[[], Island],
                 phase: Callable[[str], None]) -> Island:
        """The newest global of each of the n fragments into the island that `build`
        makes meanwhile (the "model" phase, told to `phase`). The fragments are read on
        a thread of their own, back to back, PULL_AHEAD of them at most in memory (each a
        fragment's message); this thread builds the island, faults in the first step's
        gradients and AdamW moments (syncd/malloc.py: it is the thread that will step)
        and takes each fragment in, and the reads go on meanwhile: building and faults
        take the pull's link time, not the rejoin's."""
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="pull") as reader:
            reads = deque(reader.submit(self.full, p) for p in range(min(n, PULL_AHEAD)))
            self.island = build()
            phase("model")
            fault_in(self.island.model.parameters(), copies=3)
            for p in range(n):
                version, tensors = reads.popleft().result()
                self.island.reset_fragment(p, tensors, version)
                del tensors  # its message goes before the next read begins
                if p + PULL_AHEAD < n:
                    reads.append(reader.submit(self.full, p + PULL_AHEAD))
        return self.island

    def request(self, p: int, seq: int) -> None:
        """Download fragment p once syncd handled this island's update `seq` of it."""
        self.downloads.request(p, seq, self.island.state[p].version)

    def pull(self, p: int, block: bool = False) -> bool:
        """Mix in fragment p's download if it has arrived (or, with `block`, once it
        has); False if it has not arrived yet."""
        started = time.monotonic()
        try:
            download = self.downloads.wait(p) if block else self.downloads.take(p)
        except GlobalMissing:
            if self.run_ended():
                self.stop()  # the run ended and its state went with it
                raise SystemExit(0) from None
            raise
        if download is None:
            return False
        if download.published:
            mixing = time.monotonic()
            self.island.mix_published(p, download.published, download.version)
            self.bytes_down += download.nbytes
            self.pulls += 1
            self.pull_s += download.read_s + time.monotonic() - mixing
            self.pull_link_s += download.seconds
            self.share(p)
        self.pull_wait_s += time.monotonic() - started
        return True

    def mix(self, mix_at: dict, barrier: Callable[[int, int], bool] | None) -> bool:
        """Take each merged fragment of `mix_at` (fragment -> (inner step to mix at, seq
        of the send that must be handled first)) that has arrived once its step is
        reached (one that has not is mixed at a later step, and counted late). With a
        `barrier` (elastic) it waits for the merge and the download; False if the
        barrier says a whole-job restart or the run's end came first."""
        for p, (at, seq) in list(mix_at.items()):
            if self.island.step < at:
                continue
            if barrier is not None and not barrier(p, seq):
                return False
            if self.pull(p, block=barrier is not None):
                del mix_at[p]
                if self.island.step > at:
                    self.late_globals += 1
        return True

    def reset_all(self) -> None:
        """Elastic's whole-job restart: every fragment taken whole again, downloads
        under way forgotten."""
        self.downloads.cancel()
        for p in range(len(self.island.fragments)):
            version, tensors = self.full(p)
            self.island.reset_fragment(p, tensors, version)
            self.share(p)

    def share(self, p: int) -> None:
        """Fragment p changed outside a step: the island's other ranks take it as it is here."""
        if self.group:
            self.group.announce_fragment(self.island, p)
