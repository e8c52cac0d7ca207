"""python -m trainer.runner: one epoch of one island, as its own process.

The supervisor (trainer/supervisor.py, inside a Celery task) starts it and can
kill it at any instant. It needs only Redis: it reads the run's spec, takes the
newest global fragments that syncd published, trains with diloco.island.Island,
sends updates through an emulated wide-area link, heartbeats, and keeps its data
cursor in Redis after each send so that a later epoch (a rejoin) goes on
where this one was in its shard.

Faults other than kill and stop, and the emulated link, are acted out by
trainer/emulation.py; elastic's whole-job restarts are followed with
trainer/elastic.py.

An island of several processes (islands[].processes) runs this module once per
rank, with torchrun's environment: rank 0 is the island described above, the
other ranks train their part of each batch and take what rank 0 broadcasts
(trainer/distributed.py, follow_rank). They ignore SIGTERM and stop when rank 0
says so.
"""

from __future__ import annotations

import argparse
import base64
import logging
import os
import signal
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from diloco.config import DEVICES
from diloco.config_parse import config_from_spec
from diloco.data import Corpus, load_corpus
from diloco.device import resolve_device
from diloco.fragments import due_fragments, run_fragments
from diloco.island import Island
from diloco.model import GPT
from diloco.protocol import decode_message, encode_message
from diloco.signing import load_verify_key
from diloco.sizes import kept_sends
from diloco.synchronizer import Published
from syncd.bulk import BulkError
from syncd.connection import connect
from syncd.malloc import fault_in, return_large_frees
from syncd.store import RunStore
from trainer.cpu import cpu_share
from trainer.distributed import IslandGroup, follow_rank
from trainer.downloads import RETRY_S, Downloads, GlobalMissing, NotReadable
from trainer.elastic import WholeJobRestarts
from trainer.emulation import FaultEmulation
from trainer.launch import (
    ASKED_AT_ENV,
    DATAPLANE_URL_ENV,
    LAUNCHED_AT_ENV,
    REDIS_URL_ENV,
    env_time,
    exit_now,
    island_key_from_env,
    process_started_at,
)
from trainer.link import HEARTBEAT_S, POLL_S, Link, beating
from trainer.phases import StartClock
from trainer.resend import SentUpdates

log = logging.getLogger("archipelago.island")
# Fragments of the first pull read ahead of the one the island takes in: the reads go
# on while the island is built and its first step's memory faulted in, two fragments'
# messages at most beside the island (diloco/sizes.py counts 2F for a pull).
PULL_AHEAD = 2


def read_full(store: RunStore, p: int, stopping: Callable[[], bool]) -> bytearray | None:
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


class ProcessIsland:
    """The island's training loop around diloco.island.Island.

    Args:
        store: the run's Redis keys.
        name: the island's name in the run config.
        epoch: the number of this start of the island; syncd refuses updates of older ones.
        device: "auto", "cpu" or "cuda"; default: the run's train.device.
        group: the island's processes, when it has several; this is rank 0.
        idle_rss: this process's resident bytes after its imports, before the spec.
        clock: the marks of this epoch's start-up so far (trainer/phases.py);
            default: from the supervisor's environment and /proc.
        corpora: corpora already open, by (path, eval_fraction): a warm standby's.
        model: a model already built (a warm standby's); used if its shape is the run's.
        warm: this epoch is a claimed standby (its heartbeats say so).
        key: the island's key for this epoch, which signs its updates
            (diloco.signing.island_key); default: from the environment (ISLAND_KEY_ENV),
            where its launcher put it. The run's secret is never read.

    Raises:
        ValueError: the run has no spec, or the island no key.
    """

    def __init__(self, store: RunStore, name: str, epoch: int, device: str | None = None,
                 group: IslandGroup | None = None, idle_rss: int | None = None,
                 clock: StartClock | None = None,
                 corpora: dict[tuple[str | None, float], Corpus] | None = None,
                 model: GPT | None = None, warm: bool = False, key: bytes | None = None):
        self.store = store
        self.idle_rss = idle_rss  # bytes, after imports and before the spec is read
        self.name = name
        self.epoch = epoch
        self.clock = clock if clock is not None else StartClock(
            {"asked": env_time(ASKED_AT_ENV), "launched": env_time(LAUNCHED_AT_ENV),
             "started": process_started_at(), "imported": time.time()})
        self.corpora = corpora or {}
        self.prebuilt = model
        spec = store.spec()
        if spec is None:
            raise ValueError(f"run {store.run_id} has no spec in Redis; was it started?")
        self.run_spec = spec
        self.config = config_from_spec(spec)
        self.group = group
        self.device = group.device if group else resolve_device(
            device or self.config.train.device)
        self.elastic = spec["mode"] == "elastic"
        self.key = key if key is not None else island_key_from_env()
        self.verify_key = load_verify_key(spec["verify_key"])
        self.index = self.config.island_index(name)
        self.island_config = self.config.islands[self.index]
        self.stopping = False
        # From the supervisor's launch (interpreter and imports included) when it says,
        # from its claim for a warm standby.
        self.started = self.clock.marks.get("launched", time.time())
        self.startup_s: float | None = None  # launch to first step: elastic's delay
        self.restarts = WholeJobRestarts(store, self.config.sync.inner_steps)
        self.emulation = FaultEmulation(store, name, self.island_config, self.config.emulation,
                                        lambda: self.stopping)
        self.bytes_down = 0
        self.pulls = 0
        self.pull_s = 0.0  # reading, checking and mixing pulled fragments, in all
        self.pull_wait_s = 0.0  # of it, on the training thread (mixes, blocking waits)
        self.late_globals = 0  # merged fragments mixed after their tau overlap steps
        self.backpressure_wait_s = 0.0  # waited before sends for syncd to handle more
        self.slot_wait_s = 0.0  # the link waited for upload slots (syncd/upload_slots.py)
        self.activity = "starting"  # what the background heartbeat says the island does
        self.compute_s = 0.0  # stepping, slowdowns included: sent with each update
        self._last_beat = 0.0
        self._done = False
        self._done_read = 0.0
        self.phases: dict[str, float] | None = None  # once the first step is done
        # the first step's CPU seconds on the training thread: against its wall time
        # (phases' first_step), what it did apart from waiting for a core
        self.first_step_cpu_s: float | None = None
        self.warm = warm
        self.island: Island | None = None  # built by setup()
        self.link: Link | None = None  # opened by setup()
        self.downloads = Downloads(self.fetch, self.handled, self.emulation.transfer_time,
                                   self.emulation.wait_while_partitioned,
                                   lambda: self.stopping)
        # What syncd has not handled yet, sent again to a syncd that took the run over.
        self.sent = SentUpdates(lambda p: self.store.handled_seq(p, self.name),
                                self.store.syncd_holder,
                                kept_sends(self.config.sync.compression,
                                           len(self.config.islands)))
        self._holder_read = 0.0

    def stop(self) -> None:
        """Finish the current step, save the cursor and exit (SIGTERM, from the
        supervisor); the island's own flag, set here only."""
        self.stopping = True

    def beat(self, state: str, force: bool = False, **extra: Any) -> None:
        now = time.time()
        if not force and now - self._last_beat < HEARTBEAT_S:
            return
        if self.emulation.partitioned():
            return  # a cut link carries no heartbeats either
        self._last_beat = now
        island = self.island
        self.store.heartbeat(self.name, self.epoch, island.step if island else 0,
                             island.tokens if island else 0, state=state,
                             bytes_down=self.bytes_down, startup_s=self.startup_s,
                             pid=os.getpid(), idle_rss=self.idle_rss, pulls=self.pulls,
                             pull_s=round(self.pull_s, 4),
                             pull_wait_s=round(self.pull_wait_s, 4),
                             late_globals=self.late_globals,
                             backpressure_wait_s=round(self.backpressure_wait_s, 4),
                             slot_wait_s=round(self.slot_wait_s, 4),
                             phases=self.phases, first_step_cpu_s=self.first_step_cpu_s,
                             warm=self.warm, cpu_share=cpu_share(), **extra)

    # -- globals -------------------------------------------------------------

    def _wait_for_globals(self, num_fragments: int) -> dict[int, int]:
        while not self.stopping:
            versions = self.store.versions()
            if len(versions) >= num_fragments:
                return versions
            self.beat("starting")
            time.sleep(POLL_S)
        if self.group:
            self.group.broadcast_object(None)  # the other ranks end too
            self.group.close()
        raise SystemExit(0)

    def _full(self, p: int) -> tuple[int, dict[str, torch.Tensor]]:
        """The newest global fragment p, read chunk by chunk into one buffer whose views
        are the tensors (no further copy), over the emulated link as every later pull
        is: not while it is cut, and in the larger of the real read and the link's time."""
        self.emulation.wait_while_partitioned()
        started = time.monotonic()
        blob = read_full(self.store, p, lambda: self.stopping)
        if blob is None:
            if self.run_ended():
                self.stopping = True  # the run ended and its state went with it
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
        if self.config.sync.downlink_compression != "none":
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

    def pull(self, p: int, block: bool = False) -> bool:
        """Mix in fragment p's download if it has arrived (or, with `block`, once it
        has); False if it has not arrived yet."""
        started = time.monotonic()
        try:
            download = self.downloads.wait(p) if block else self.downloads.take(p)
        except GlobalMissing:
            if self.run_ended():
                self.stopping = True  # the run ended and its state went with it
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
            self.share(p)
        self.pull_wait_s += time.monotonic() - started
        return True

    def share(self, p: int) -> None:
        """Fragment p changed outside a step: the island's other ranks take it as it is here."""
        if self.group:
            self.group.announce_fragment(self.island, p)

    def follow_restart(self, mix_at: dict) -> None:
        """Elastic: when syncd restarts the whole job, pause for the restart delay, then
        take the rolled-back global model whole and go on from there."""
        until = self.restarts.take()
        if until is None:
            return
        self.join_restart(until)
        mix_at.clear()
        self.downloads.cancel()
        for p in range(len(self.island.fragments)):
            version, tensors = self._full(p)
            self.island.reset_fragment(p, tensors, version)
            self.share(p)

    def join_restart(self, until: float) -> None:
        """Elastic: start a fresh outer step with the other islands, at `until`."""
        self.restarts.join(self.island, until, lambda: self.beat("restarting"),
                           lambda: self.stopping)

    def mix(self, mix_at: dict) -> bool:
        """Take each merged fragment that has arrived once its tau overlapping steps are
        done (one that has not is mixed at a later step, and counted late); elastic
        waits for it at the barrier. False if a whole-job restart or the run's end
        came first."""
        for p, (at, seq) in list(mix_at.items()):
            if self.island.step < at:
                continue
            if self.elastic and not self.wait_for_merge(p, seq):
                return False
            if self.pull(p, block=self.elastic):
                del mix_at[p]
                if self.island.step > at:
                    self.late_globals += 1
        return True

    def wait_for_merge(self, p: int, seq: int) -> bool:
        """Wait until syncd handled (merged or refused) update `seq` of fragment p: with
        tau = 0, and in elastic, where the outer step is a barrier over every live
        island, after the tau overlapping steps. False when a whole-job restart or the
        run's end comes first."""
        self.activity = "waiting"
        try:
            while not self.handled(p, seq):
                if self.stopping or self.done() or self.restarts.pending():
                    return False
                self.send_again()
                self.beat("waiting")
                time.sleep(POLL_S)
            return True
        finally:
            self.activity = "training"

    def hold_back(self, p: int, mix_at: dict | None = None) -> None:
        """Backpressure: before its next send of fragment p, wait while syncd has not
        handled the updates of p the island keeps (diloco.sizes.kept_sends)
        (trainer/resend.py `SentUpdates.must_wait`), so that a syncd that does not merge
        (a round short of its quorum, syncd away) holds the island back instead of
        filling Redis or pushing out a kept update. The heartbeat says `waiting`
        meanwhile, and the seconds add up in `backpressure_wait_s`; a merged fragment
        that arrives meanwhile is mixed (`mix_at`, the loop's). A stop, the run's end or
        a whole-job restart ends the wait: a stop's last sends go out, at most one more
        per fragment."""
        last = time.monotonic()
        while self.sent.must_wait(p):
            if self.stopping or self.done() or self.restarts.pending():
                break
            self.send_again()
            if mix_at and not self.elastic:  # elastic's barrier never gets here
                self.mix(mix_at)
            self.activity = "waiting"
            self.beat("waiting")
            time.sleep(POLL_S)
            now = time.monotonic()
            self.backpressure_wait_s += now - last
            last = now
        self.activity = "training"

    def handled(self, p: int, seq: int) -> bool:
        """Whether syncd merged or dropped this island's update `seq` of fragment p."""
        return self.store.handled_seq(p, self.name) >= seq

    # -- the loop ------------------------------------------------------------

    def _phase(self, name: str) -> None:
        """Phase `name` ended now: marked, and logged with its seconds."""
        self.clock.mark(name, time.time())
        seconds = self.clock.breakdown().get(name)
        log.info("island %s epoch %d: phase %s done%s", self.name, self.epoch, name,
                 "" if seconds is None else f" in {seconds:.3f} s")

    def _corpus(self) -> Corpus:
        """The run's corpus: one a standby already opened, or opened now."""
        data = self.config.data
        corpus = self.corpora.get((data.path, data.eval_fraction))
        return corpus if corpus is not None else load_corpus(data.path, data.eval_fraction)

    def setup(self) -> None:
        self.beat("starting", force=True)  # syncd knows this epoch from now on
        config = self.config
        fragments = run_fragments(config)
        self._wait_for_globals(len(fragments))  # syncd published version 0
        self._phase("spec")
        if self.group:
            self.group.broadcast_object(self.run_spec)  # the other ranks build their island
        # Reading the corpus and building the island take seconds on a busy host: keep
        # heartbeating, or syncd takes the island for lost before its first step.
        with beating(lambda: self.beat("starting", force=True)):
            corpus = self._corpus()
            self._phase("data")

            def build() -> Island:
                # Built in the run's shape (or a standby's model reused), then the
                # globals replace its parameters: the pull.
                island = Island(self.index, config, corpus, fragments, None, self.device,
                                self.group, model=self.prebuilt)
                self.prebuilt = None
                return island

            self._pull_all(len(fragments), build)
        cursor = self.store.cursor(self.name)
        if cursor:
            self.island.move_to(cursor["step"], cursor["tokens"])
            state = torch.frombuffer(bytearray(base64.b64decode(cursor["rng"])), dtype=torch.uint8)
            self.island.sampler.set_state(state)
        if self.elastic:
            self.join_restart(self.restarts.until())
        if self.group:
            self.group.share_start(self.island)
        self.link = Link(self.deliver,
                         self.emulation.transfer_time, self.emulation.wait_while_partitioned,
                         max_pending=2 * len(fragments))
        self._phase("pull")

    def _pull_all(self, n: int, build: Callable[[], Island]) -> None:
        """The newest global of each of the n fragments into the island that `build`
        makes meanwhile (the "model" phase). The fragments are read on a thread of
        their own, back to back, PULL_AHEAD of them at most in memory (each a fragment's
        message); this thread builds the island, faults in the first step's gradients
        and AdamW moments (syncd/malloc.py: it is the thread that will step) and takes
        each fragment in, and the reads go on meanwhile: building and faults take the
        pull's link time, not the rejoin's."""
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="pull") as reader:
            reads = deque(reader.submit(self._full, p) for p in range(min(n, PULL_AHEAD)))
            self.island = build()
            self._phase("model")
            fault_in(self.island.model.parameters(), copies=3)
            for p in range(n):
                version, tensors = reads.popleft().result()
                self.island.reset_fragment(p, tensors, version)
                del tensors  # its message goes before the next read begins
                if p + PULL_AHEAD < n:
                    reads.append(reader.submit(self._full, p + PULL_AHEAD))

    def deliver(self, fragment: int, seq: int, message: bytes | bytearray) -> None:
        """Write an update message to the data plane once it holds one of the run's upload
        slots (syncd/upload_slots.py), on the link's thread. One written as the run
        ended, after syncd freed its keys, is deleted again with what it made anew."""
        self.slot_wait_s += self.store.wait_for_slot(self.name, self.epoch, fragment, seq,
                                                     self.config.sync.upload_slots)
        self.store.push_update(self.name, self.epoch, fragment, seq, message)
        if self.run_ended():
            self.store.clear_after_end(self.name, self.epoch, fragment, seq, len(message))

    def save_cursor(self) -> None:
        rng = base64.b64encode(self.island.sampler.state().numpy().tobytes()).decode()
        self.store.save_cursor(self.name, {"step": self.island.step,
                                           "tokens": self.island.tokens, "rng": rng})

    def done(self) -> bool:
        """Whether syncd marked the run done; asked at most five times a second."""
        now = time.time()
        if now - self._done_read > 0.2:
            self._done = self.store.done()
            self._done_read = now
        return self._done

    def run_ended(self) -> bool:
        """Whether the run is over for good (done, or no longer active: stopped or
        deleted, its state freed)."""
        return self.store.done() or not self.store.is_active()

    def send(self, p: int, mix_at: dict | None = None) -> None:
        s = self.config.sync
        self.island.finish_encoding()  # the last send is kept (self.sent) before this one
        self.hold_back(p, mix_at)
        about = {"run": self.store.run_id, "island": self.name, "epoch": self.epoch,
                 "compute_s": self.compute_s, "codec": s.compression}

        def deliver(meta: dict, payload: dict[str, torch.Tensor]) -> None:
            # On the island's encoding thread, during the next step's forward pass.
            message = encode_message("update", meta | about, self.emulation.corrupt(payload),
                                     self.key)
            self.link.send(p, meta["seq"], message)
            self.sent.add(p, meta["seq"], message)

        self.island.send_update(p, s.compression, deliver)
        self.save_cursor()

    def send_again(self) -> None:
        """Send again what syncd has not handled if its lease changed hands (a restarted
        syncd lost its open rounds: trainer/resend.py); asked at most five times a second."""
        now = time.time()
        if now - self._holder_read < 0.2:
            return
        self._holder_read = now
        for p, seq, message in self.sent.to_send_again():
            log.info("island %s: syncd's lease changed hands; sending update %d of "
                     "fragment %d again", self.name, seq, p)
            self.link.send(p, seq, message)

    def flush(self) -> None:
        """A user stopped the run: send every fragment's steps not sent yet, which syncd
        merges before the run's final checkpoint."""
        for p, state in enumerate(self.island.state):
            if state.inner_steps:
                self.send(p)

    def step(self) -> None:
        started = time.time()
        if self.group:
            self.group.announce_step(self.island)
        loss = self.island.inner_step()
        elapsed = time.time() - started
        slow = self.emulation.slowdown()
        if slow > 1.0:
            time.sleep(elapsed * (slow - 1.0))
        self.compute_s += time.time() - started
        if self.startup_s is not None:  # the first step's beat carries the phases: run()
            self.beat("training", loss=loss, bytes_up=self.link.bytes_up)

    def run(self) -> int:
        self.setup()
        # A step, an encode or a mix of a big model can outlast the heartbeat timeout:
        # a thread beats whenever the loop has not for a heartbeat's interval.
        with beating(self.beat_for_loop):
            self.train()
        return self.finish()

    def beat_for_loop(self) -> None:
        """The heartbeat the loop would send, from the heartbeat thread, when the loop
        has sent none for two intervals: its step or send is long."""
        if time.time() - self._last_beat < 2 * HEARTBEAT_S or self.startup_s is None:
            return
        if self.activity == "training":
            self.beat("training", loss=self.island.last_loss, bytes_up=self.link.bytes_up)
        else:
            self.beat(self.activity)

    def train(self) -> None:
        s = self.config.sync
        # fragment -> (inner step to mix at, seq of the send that must be handled first);
        # a second send before the mix keeps the first one's target.
        mix_at: dict[int, tuple[int, int]] = {}
        while not self.stopping and not self.done():
            if self.elastic:  # before the step: the step after a restart's is never a send
                self.follow_restart(mix_at)
            cpu = time.thread_time()
            self.step()
            if self.startup_s is None:
                self.first_step_cpu_s = round(time.thread_time() - cpu, 3)
                self.activity = "training"
                self._phase("first_step")
                self.startup_s = time.time() - self.started
                self.phases = self.clock.breakdown()
                # The first "training" heartbeat goes out at once, with no throttle.
                self.beat("training", force=True, loss=self.island.last_loss,
                          bytes_up=self.link.bytes_up)
            self.send_again()
            if not self.mix(mix_at):
                continue  # a whole-job restart, followed before the next step
            for p in due_fragments(self.island.step, s.inner_steps, s.fragments):
                self.send(p, mix_at)
                seq = self.island.step
                self.downloads.request(p, seq, self.island.state[p].version)
                if s.overlap_steps == 0:
                    if self.wait_for_merge(p, seq):
                        self.pull(p, block=True)
                else:
                    mix_at.setdefault(p, (seq + s.overlap_steps, seq))

    def finish(self) -> int:
        """The loop ended: flush a user's stop, tell the other ranks, drain the link."""
        if self.stopping and self.store.stop_requested() is not None:
            self.flush()
        if self.group:
            self.group.announce_stop()
            self.group.close(self.island)
        self.island.finish_encoding()
        if self.done():
            self.link.discard()  # the run completed: its Redis keys are freed already
        self.link.drain(timeout=5.0)
        self.beat("stopped", force=True)
        return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True)
    parser.add_argument("--island", required=True)
    parser.add_argument("--epoch", type=int, required=True)
    parser.add_argument("--device", default=None, choices=DEVICES,
                        help="default: the run's train.device")
    args = parser.parse_args()
    redis_url = os.environ.get(REDIS_URL_ENV)
    if not redis_url:
        parser.error(f"the Redis URL must be in the environment variable {REDIS_URL_ENV}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    torch.set_num_threads(1)  # several islands share a host's cores
    return_large_frees(keep_heap=True)
    group = None
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        group = IslandGroup.from_env(args.device or "auto")
        if group.rank > 0:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # rank 0 says when to stop
            log.info("island %s rank %d of %d on %s", args.island, group.rank,
                     group.world_size, group.device)
            exit_now(follow_rank(group, args.island))
    dataplane_url = os.environ.get(DATAPLANE_URL_ENV) or redis_url
    store = RunStore(connect(redis_url, ride_out_restarts=True), args.run,
                     data=connect(dataplane_url, ride_out_restarts=True))
    island = ProcessIsland(store, args.island, args.epoch, args.device, group, rss_bytes())

    def stop(signum: int, frame: object) -> None:
        island.stop()

    signal.signal(signal.SIGTERM, stop)
    log.info("island %s epoch %d of run %s starting on %s", args.island, args.epoch, args.run,
             island.device)
    exit_now(island.run())


def rss_bytes() -> int:
    """This process's resident memory now."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


if __name__ == "__main__":
    main()
