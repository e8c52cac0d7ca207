"""Downloads of merged global fragments, off the island's training thread.

Streaming DiLoCo overlaps the download of a merged fragment with the tau inner
steps that follow its send. So the island asks for fragment p right after it
sends p (`request`); a thread of its own waits until syncd has handled that
update, reads the newest published messages, checks and decodes them, and holds
them for the emulated link's time on top: over a real link the message is checked
and decoded once its last byte is in, so the two add up (the larger of the two alone
makes a pull shorter than over a link the kernel shapes at the same rate, which
`python -m bench wan` compares the emulation with). At its mixing step
the island takes what has arrived (`take`); a global not there yet is mixed at
a later step where it is. Modes that wait for the merge by design (tau = 0,
elastic's barrier) `wait` for it.

Mixing stays on the training thread: it changes the parameters.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from diloco.synchronizer import Published
from trainer.link import POLL_S


class GlobalMissing(RuntimeError):
    """The published fragment a download names is not in Redis (the run ended, or its
    state was lost)."""


class NotReadable(RuntimeError):
    """The published fragment cannot be read now (the syncd whose server its reference
    names is gone, and the next one has not published it again yet): tried again."""


RETRY_S = 1.0  # between two tries of a fragment that could not be read


@dataclass(frozen=True)
class Download:
    """What arrived for one fragment.

    Attributes:
        fragment: the fragment's index.
        version: the version it brings; the island's own when syncd published nothing
            newer (it refused or dropped the update).
        published: the messages to apply to the island's anchor, oldest first.
        nbytes: bytes read from Redis.
        read_s: seconds of the real read, check and decode.
        seconds: seconds from the start of the transfer to its arrival, the emulated
            link's time included.
    """

    fragment: int
    version: int
    published: list[Published]
    nbytes: int
    read_s: float
    seconds: float


Fetch = Callable[[int, int], tuple[int, list[Published], int]]


class Downloads:
    """The island's downloads of merged fragments, one at a time, in request order, as
    one link carries them.

    Args:
        fetch: reads fragment p's messages newer than `version` (on the thread):
            returns (version, messages, bytes read); raises GlobalMissing, or
            NotReadable, after which it is called again RETRY_S later.
        handled: whether syncd handled this island's update `seq` of fragment p.
        transfer_time: the emulated link's seconds for so many bytes now.
        wait_while_partitioned: returns once the link is not cut.
        stopping: whether the island is stopping.
        sleep: waits so many seconds (the emulated link's rest).
    """

    def __init__(self, fetch: Fetch, handled: Callable[[int, int], bool],
                 transfer_time: Callable[[int], float],
                 wait_while_partitioned: Callable[[], None], stopping: Callable[[], bool],
                 sleep: Callable[[float], None] = time.sleep):
        self.fetch = fetch
        self.sleep = sleep
        self.handled = handled
        self.transfer_time = transfer_time
        self.wait_while_partitioned = wait_while_partitioned
        self.stopping = stopping
        self.error: BaseException | None = None
        self._requests: queue.Queue[tuple[int, int, int, int]] = queue.Queue()
        self._arrived = threading.Condition()
        self._done: dict[int, Download] = {}
        self._asked: set[int] = set()
        self._generation = 0  # cancel() moves it on: older requests are dropped
        self._thread = threading.Thread(target=self._run, daemon=True, name="downloads")
        self._thread.start()

    def request(self, fragment: int, seq: int, version: int) -> None:
        """Download fragment p once syncd handled update `seq`, if it is not asked for
        already; `version` is the island's version of it now."""
        with self._arrived:
            if fragment in self._asked:
                return
            self._asked.add(fragment)
            self._requests.put((self._generation, fragment, seq, version))

    def take(self, fragment: int) -> Download | None:
        """The download of fragment p if it has arrived (it is handed over once)."""
        with self._arrived:
            self._raise_error()
            return self._pop(fragment)

    def wait(self, fragment: int) -> Download | None:
        """The download of fragment p, waiting for it; None if the island stops first."""
        with self._arrived:
            while fragment not in self._done and not self.stopping():
                self._raise_error()
                self._arrived.wait(POLL_S)
            self._raise_error()
            return self._pop(fragment)

    def cancel(self) -> None:
        """Forget every download asked for (elastic's whole-job restart)."""
        with self._arrived:
            self._generation += 1
            self._asked.clear()
            self._done.clear()

    def _pop(self, fragment: int) -> Download | None:
        download = self._done.pop(fragment, None)
        if download is not None:
            self._asked.discard(fragment)
        return download

    def _raise_error(self) -> None:
        if isinstance(self.error, GlobalMissing):
            raise self.error
        if self.error is not None:
            raise RuntimeError("the downloads thread failed") from self.error

    def _current(self, generation: int) -> bool:
        with self._arrived:
            return generation == self._generation

    def _run(self) -> None:
        try:
            while True:
                generation, fragment, seq, version = self._requests.get()
                while not self.handled(fragment, seq):
                    if self.stopping() or not self._current(generation):
                        break
                    time.sleep(POLL_S)
                else:
                    self._download(generation, fragment, version)
        except BaseException as exc:  # surfaced on the next take or wait
            with self._arrived:
                self.error = exc
                self._arrived.notify_all()

    def _download(self, generation: int, fragment: int, version: int) -> None:
        self.wait_while_partitioned()  # a cut link carries no downloads either
        started = time.monotonic()
        while True:
            try:
                newest, published, nbytes = self.fetch(fragment, version)
                break
            except NotReadable:
                if self.stopping() or not self._current(generation):
                    return
                self.sleep(RETRY_S)
        read_s = time.monotonic() - started
        link_s = self.transfer_time(nbytes) if published else 0.0
        self.sleep(link_s)
        download = Download(fragment, newest, published, nbytes, read_s,
                            time.monotonic() - started)
        with self._arrived:
            if generation == self._generation:
                self._done[fragment] = download
                self._arrived.notify_all()
