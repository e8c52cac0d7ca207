"""The island's sending: its updates signed and handed to the emulated link
(trainer/link.py), written to the data plane once they hold an upload slot, kept until
syncd handled them (trainer/resend.py) and sent again to a syncd that took the run over,
and the counts of its waits that its heartbeats carry.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch

from diloco.island import Island
from diloco.protocol import encode_message
from diloco.sizes import kept_sends
from syncd.store import RunStore
from trainer.emulation import FaultEmulation
from trainer.link import POLL_S, Link
from trainer.resend import SentUpdates

log = logging.getLogger("archipelago.island")


class Sending:
    """What an island sends to syncd, and how long it waited to.

    Args:
        store: the run's Redis keys.
        name: the island's name in the run config.
        epoch: the number of this start of the island.
        key: the island's key for this epoch, which signs its updates.
        compression: the run's uplink codec (sync.compression).
        upload_slots: the run's sync.upload_slots.
        islands: how many islands the run has (how many sends are kept: kept_sends).
        emulation: the island's faults and emulated link.
        run_ended: whether the run is over for good.
    """

    def __init__(self, store: RunStore, name: str, epoch: int, key: bytes, compression: str,
                 upload_slots: int, islands: int, emulation: FaultEmulation,
                 run_ended: Callable[[], bool]):
        self.store = store
        self.name = name
        self.epoch = epoch
        self.key = key
        self.compression = compression
        self.upload_slots = upload_slots
        self.emulation = emulation
        self.run_ended = run_ended
        self.backpressure_wait_s = 0.0  # waited before sends for syncd to handle more
        self.slot_wait_s = 0.0  # the link waited for upload slots (syncd/upload_slots.py)
        self.link: Link | None = None  # opened by open()
        # What syncd has not handled yet, sent again to a syncd that took the run over.
        # What syncd handled of the kept updates and who holds its lease, as the island's
        # tend thread last read them (`read`): the training loop does not wait for Redis.
        self.sent = SentUpdates(lambda p: self._handled.get(p, -1), lambda: self._holder,
                                kept_sends(compression, islands))
        self._handled: dict[int, int] = {}
        self._holder: str | None = None

    def open(self, max_pending: int) -> None:
        """Open the link, `max_pending` messages queued at most; syncd's lease holder
        read first."""
        self.read()
        self.link = Link(self.deliver, self.emulation.transfer_time,
                         self.emulation.wait_while_partitioned, max_pending=max_pending)

    @property
    def bytes_up(self) -> int:
        """Bytes the link delivered so far (0 before it opens)."""
        return self.link.bytes_up if self.link else 0

    @property
    def sends(self) -> int:
        """Update messages the link delivered so far (0 before it opens)."""
        return self.link.sends if self.link else 0

    @property
    def send_link_s(self) -> float:
        """Seconds the sends took on the link so far: the emulated link's hold and the
        write to the data plane (across the network), the waits for upload slots apart."""
        return self.link.busy_s - self.slot_wait_s if self.link else 0.0

    def deliver(self, fragment: int, seq: int, message: bytes | bytearray) -> None:
        """Write an update message to the data plane once it holds one of the run's upload
        slots (syncd/upload_slots.py), on the link's thread. One written as the run
        ended, after syncd freed its keys, is deleted again with what it made anew."""
        self.slot_wait_s += self.store.updates.wait_for_slot(self.name, self.epoch, fragment, seq,
                                                             self.upload_slots)
        self.store.updates.push_update(self.name, self.epoch, fragment, seq, message)
        if self.run_ended():
            self.store.updates.clear_after_end(self.name, self.epoch, fragment, seq, len(message))

    def hold_back(self, p: int, interrupted: Callable[[], bool],
                  meanwhile: Callable[[], None]) -> None:
        """Backpressure: before its next send of fragment p, wait while syncd has not
        handled the updates of p the island keeps (diloco.sizes.kept_sends)
        (trainer/resend.py `SentUpdates.must_wait`), so that a syncd that does not merge
        (a round short of its quorum, syncd away) holds the island back instead of
        filling Redis or pushing out a kept update. `meanwhile` runs each poll (the
        island beats `waiting` and mixes what arrived), and the seconds add up in
        `backpressure_wait_s`. The wait ends when `interrupted` says so (a stop, the
        run's end or a whole-job restart): a stop's last sends go out, at most one more
        per fragment."""
        last = time.monotonic()
        while self.sent.must_wait(p):  # as the tend thread last read what syncd handled
            self.read()  # waiting anyway: what it handled now
            if not self.sent.must_wait(p) or interrupted():
                break
            self.send_again()
            meanwhile()
            time.sleep(POLL_S)
            now = time.monotonic()
            self.backpressure_wait_s += now - last
            last = now

    def send(self, island: Island, p: int, compute_s: float) -> None:
        """Send fragment p's update of `island`, whose stepping took `compute_s` so far:
        encoded and signed on the island's encoding thread, during the next step's
        forward pass."""
        about = {"run": self.store.run_id, "island": self.name, "epoch": self.epoch,
                 "compute_s": compute_s, "codec": self.compression}

        def deliver(meta: dict, payload: dict[str, torch.Tensor]) -> None:
            message = encode_message("update", meta | about, self.emulation.corrupt(payload),
                                     self.key)
            self.link.send(p, meta["seq"], message)
            self.sent.add(p, meta["seq"], message)

        island.send_update(p, self.compression, deliver)

    def read(self) -> None:
        """Read syncd's lease holder and what it handled of the kept updates, now (the
        island's tend thread does, every TEND_S)."""
        self._handled = self.store.globals.handled_seqs(self.sent.fragments(), self.name)
        self._holder = self.store.syncd_holder()

    def send_again(self) -> None:
        """Send again what syncd has not handled if its lease changed hands since the
        holder read before (a restarted syncd lost its open rounds: trainer/resend.py)."""
        for p, seq, message in self.sent.to_send_again():
            log.info("island %s: syncd's lease changed hands; sending update %d of "
                     "fragment %d again", self.name, seq, p)
            self.link.send(p, seq, message)

    def close(self, discard: bool) -> None:
        """Let the link deliver what it holds, five seconds at most; with `discard`
        (the run completed: its keys are freed already) drop it instead."""
        if discard:
            self.link.discard()
        self.link.drain(timeout=5.0)
