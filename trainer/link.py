"""The island process's helper threads: its emulated wide-area link, and heartbeats
while its main thread is busy."""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterator

import redis

HEARTBEAT_S = 0.25
POLL_S = 0.05


def heartbeat_seconds(value: float) -> float:
    """Seconds as a heartbeat carries them: to 0.1 ms, never below 0."""
    return round(max(value, 0.0), 4)


@contextlib.contextmanager
def beating(beat: Callable[[], None], every_s: float = HEARTBEAT_S,
            name: str = "heartbeat") -> Iterator[None]:
    """Call `beat` from a thread of this `name` every `every_s` while the body runs."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(every_s):
            beat()

    thread = threading.Thread(target=loop, name=name, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


class RedisFull(RuntimeError):
    """The run's Redis is out of memory; str() says what to do."""


class Link:
    """An emulated wide-area link: a sender thread that holds each message for
    latency + bytes * bytes_scale * 8 / bandwidth before it reaches Redis.

    The queue is bounded: when syncd or Redis cannot keep up, the island waits
    to send (backpressure) instead of piling up updates in memory.

    The island hands it callables rather than itself: the link imports nothing of
    the island (trainer/runner.py imports it), and still reads the island's faults at
    the moment each message goes out.

    Args:
        deliver: puts one message into Redis, given (fragment, seq, message).
        transfer_time: the seconds a message of so many bytes takes on the link now.
        wait_while_partitioned: returns once the link is not cut (at once if it is not).
        max_pending: messages queued at most before `send` waits.
    """

    def __init__(self, deliver: Callable[[int, int, bytes | bytearray], None],
                 transfer_time: Callable[[int], float],
                 wait_while_partitioned: Callable[[], None], max_pending: int):
        self.deliver = deliver
        self.transfer_time = transfer_time
        self.wait_while_partitioned = wait_while_partitioned
        self.queue: queue.Queue = queue.Queue(maxsize=max_pending)
        self.bytes_up = 0
        self.sends = 0  # messages delivered
        self.busy_s = 0.0  # seconds from taking each of them to its delivery, in all
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True, name="link")
        self.thread.start()

    def send(self, fragment: int, seq: int, blob: bytes | bytearray) -> None:
        """Queue a message, waiting while the queue is full; raises the link thread's
        error, also one that ends it while this waits (nothing would take from the
        queue again)."""
        while True:
            if isinstance(self.error, RedisFull):
                raise self.error
            if self.error:
                raise RuntimeError("the link thread failed") from self.error
            try:
                self.queue.put((fragment, seq, blob), timeout=POLL_S)
                return
            except queue.Full:
                continue

    def _run(self) -> None:
        try:
            while True:
                fragment, seq, blob = self.queue.get()
                self.wait_while_partitioned()
                taken = time.monotonic()
                time.sleep(self.transfer_time(len(blob)))
                self.deliver(fragment, seq, blob)
                self.busy_s += time.monotonic() - taken
                self.sends += 1
                self.bytes_up += len(blob)
                self.queue.task_done()
        except redis.OutOfMemoryError as exc:
            self.error = RedisFull("Redis refused the update: it is at its maxmemory "
                                   f"({exc}). The run does not fit the Redis it was given: "
                                   "see its size estimate, or raise REDIS_MAXMEMORY_MB")
        except BaseException as exc:  # surfaced on the next send
            self.error = exc

    def discard(self) -> None:
        """Drop the messages still waiting: the run is over and nothing merges them."""
        while True:
            try:
                self.queue.get_nowait()
            except queue.Empty:
                return
            self.queue.task_done()

    def drain(self, timeout: float) -> None:
        deadline = time.time() + timeout
        while self.queue.unfinished_tasks and time.time() < deadline and not self.error:
            time.sleep(POLL_S)
