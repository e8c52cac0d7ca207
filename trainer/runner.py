"""python -m trainer.runner: one epoch of one island, as its own process.

The supervisor (trainer/supervisor.py, inside a Celery task) starts it and can
kill it at any instant. It needs only Redis: it reads the run's spec, takes the
newest global fragments that syncd published, trains with diloco.island.Island, sends
updates through an emulated wide-area link, heartbeats, and keeps its data cursor in
Redis after each send: a later epoch (a rejoin) goes on where this one was.

Faults other than kill and stop, and the emulated link, are acted out by
trainer/emulation.py; elastic's whole-job restarts followed with trainer/elastic.py.

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
import math
import os
import signal
import time

import psutil
import torch

from diloco.config import DEVICES
from diloco.config_parse import config_from_spec
from diloco.data import Corpus, corpus_key, run_corpus
from diloco.device import resolve_device
from diloco.fragments import due_fragments, run_fragments
from diloco.island import Island, Model
from diloco.signing import load_verify_key
from diloco.tokenizer import BYTES, check_tokenizer
from syncd.acl import island_store
from syncd.environment import data_dir, text, whole
from syncd.malloc import return_large_frees
from syncd.records import Heartbeat
from syncd.store import RunStore
from trainer.cpu import cpu_share
from trainer.distributed import IslandGroup, follow_rank
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
from trainer.link import HEARTBEAT_S, POLL_S, beating, heartbeat_seconds
from trainer.phases import StartClock
from trainer.pulling import Pulling
from trainer.sending import Sending
from trainer.tending import TEND_S, Tending

log = logging.getLogger("archipelago.island")


class ProcessIsland:
    """The island's training loop around diloco.island.Island: its pulling
    (trainer/pulling.py) and its sending (trainer/sending.py) are its collaborators.

    Args:
        store: the run's Redis keys.
        name: the island's name in the run config.
        epoch: the number of this start of the island; syncd refuses updates of older ones.
        device: "auto", "cpu" or "cuda"; default: the run's train.device.
        group: the island's processes, when it has several; this is rank 0.
        idle_rss: this process's resident bytes after its imports, before the spec.
        clock: the marks of this epoch's start-up so far (trainer/phases.py);
            default: from the supervisor's environment and /proc.
        corpora: corpora already open, by diloco.data.corpus_key: a warm standby's.
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
                 corpora: dict[tuple, Corpus] | None = None,
                 model: Model | None = None, warm: bool = False, key: bytes | None = None):
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
        self.config = config = config_from_spec(spec)
        self.group = group
        self.device = group.device if group else resolve_device(
            device or config.train.device)
        self.elastic = spec["mode"] == "elastic"
        self.index = config.island_index(name)
        self.stopping = False
        # From the supervisor's launch (interpreter and imports included) when it says,
        # from its claim for a warm standby.
        self.started = self.clock.marks.get("launched", time.time())
        self.startup_s: float | None = None  # launch to first step: elastic's delay
        self.restarts = WholeJobRestarts(store.control, config.sync.inner_steps)
        self.emulation = FaultEmulation(store.signals, name, config.islands[self.index],
                                        config.emulation,
                                        lambda: self.stopping)
        self.activity = "starting"  # what the background heartbeat says the island does
        self.compute_s = 0.0  # stepping, slowdowns included: sent with each update
        self.trained_at_send = 0.0  # compute_s at the island's last send
        self._last_beat = 0.0
        self.phases: dict[str, float] | None = None  # once the first step is done
        # the first step's CPU seconds on the training thread: against its wall time
        # (phases' first_step), what it did apart from waiting for a core
        self.first_step_cpu_s: float | None = None
        self.warm = warm
        self.island: Island | None = None  # built by setup()
        self.pulling = Pulling(store.globals, name, load_verify_key(spec["verify_key"]),
                               config.sync.downlink_compression, self.emulation, group,
                               lambda: self.stopping, self.stop, self.run_ended)
        self.sending = Sending(store, name, epoch,
                               key if key is not None else island_key_from_env(),
                               config.sync.compression, config.sync.upload_slots,
                               len(config.islands), self.emulation, self.run_ended)
        self.tending = Tending(store, name, self.emulation, self.sending,
                               lambda: self.beat(self.activity, force=True))

    def stop(self) -> None:
        """Finish the current step, save the cursor and exit (SIGTERM, from the
        supervisor, or the run's end seen by the pulling); the island's own flag."""
        self.stopping = True

    def heartbeat(self, state: str) -> Heartbeat:
        """The island's heartbeat now, in `state`: its own counters and its pulling's and
        sending's, each within the bounds syncd reads (`Heartbeat.from_dict`)."""
        island, pulling, sending = self.island, self.pulling, self.sending
        loss = island.last_loss if island is not None else math.nan
        return Heartbeat(
            epoch=self.epoch, time=time.time(), step=island.step if island else 0,
            tokens=island.tokens if island else 0, state=state,
            loss=loss if math.isfinite(loss) and loss >= 0 else None,
            bytes_up=sending.bytes_up, bytes_down=pulling.bytes_down,
            startup_s=self.startup_s, pid=os.getpid(), idle_rss=self.idle_rss,
            pulls=pulling.pulls, pull_s=heartbeat_seconds(pulling.pull_s),
            pull_link_s=heartbeat_seconds(pulling.pull_link_s), sends=sending.sends,
            send_link_s=heartbeat_seconds(sending.send_link_s),
            pull_wait_s=heartbeat_seconds(pulling.pull_wait_s), late_globals=pulling.late_globals,
            backpressure_wait_s=heartbeat_seconds(sending.backpressure_wait_s),
            slot_wait_s=heartbeat_seconds(sending.slot_wait_s), phases=self.phases,
            first_step_cpu_s=self.first_step_cpu_s, warm=self.warm, cpu_share=cpu_share())

    def beat(self, state: str, force: bool = False) -> None:
        """Write the island's heartbeat, at most every HEARTBEAT_S unless `force`."""
        now = time.time()
        if not force and now - self._last_beat < HEARTBEAT_S:
            return
        if self.emulation.partitioned():
            return  # a cut link carries no heartbeats either
        self._last_beat = now
        self.store.signals.heartbeat(self.name, self.heartbeat(state))

    def _wait_for_globals(self, num_fragments: int) -> dict[int, int]:
        while not self.stopping:
            versions = self.store.globals.versions()
            if len(versions) >= num_fragments:
                return versions
            self.beat("starting")
            time.sleep(POLL_S)
        if self.group:
            self.group.broadcast_object(None)  # the other ranks end too
            self.group.close()
        raise SystemExit(0)

    def follow_restart(self, mix_at: dict) -> None:
        """Elastic: when syncd restarts the whole job, pause for the restart delay, then
        take the rolled-back global model whole and go on from there."""
        until = self.restarts.take()
        if until is None:
            return
        self.join_restart(until)
        mix_at.clear()
        self.pulling.reset_all()

    def join_restart(self, until: float) -> None:
        """Elastic: start a fresh outer step with the other islands, at `until`."""
        before, self.activity = self.activity, "restarting"
        try:
            self.restarts.join(self.island, until, lambda: self.beat("restarting"),
                               lambda: self.stopping)
        finally:
            self.activity = before

    def wait(self, p: int, seq: int, mix_at: dict, limit: float | None) -> None:
        """tau 0: wait for update `seq` of fragment p's merge, at most `limit` s where syncd
        chose tau 0 (a period, H steps at its pace), then mix it in as tau >= 1 does."""
        if self.wait_for_merge(p, seq, None if limit is None else time.monotonic() + limit):
            self.pulling.pull(p, block=True)
        elif not self.interrupted():
            mix_at.setdefault(p, (seq, seq))

    def mix(self, mix_at: dict) -> bool:
        """Take each merged fragment in once its tau steps are done and it arrived (else at
        a later step, counted late); elastic waits for it at the barrier. False if a
        whole-job restart or the run's end came first."""
        return self.pulling.mix(mix_at, self.wait_for_merge if self.elastic else None)

    def interrupted(self) -> bool:
        """Whether a wait of the loop ends: a stop, the run's end or a whole-job restart."""
        return self.stopping or self.done() or self.restarts.pending()

    def wait_for_merge(self, p: int, seq: int, until: float | None = None) -> bool:
        """Wait until syncd handled (merged or refused) update `seq` of fragment p: at tau 0
        (until `until`, time.monotonic), and in elastic's barrier after its tau steps.
        False when a whole-job restart, the run's end or `until` comes first."""
        self.activity = "waiting"
        try:
            while not self.pulling.handled(p, seq):
                if self.interrupted() or (until is not None and time.monotonic() >= until):
                    return False
                self.sending.send_again()
                time.sleep(POLL_S)
            return True
        finally:
            self.activity = "training"

    def hold_back(self, p: int, mix_at: dict | None = None) -> None:
        """Backpressure before the next send of fragment p (trainer/sending.py
        `Sending.hold_back`): the heartbeat says `waiting` meanwhile, and a merged
        fragment that arrives meanwhile is mixed (`mix_at`, the loop's)."""

        def meanwhile() -> None:
            if mix_at and not self.elastic:  # elastic's barrier never gets here
                self.mix(mix_at)
            self.activity = "waiting"

        self.sending.hold_back(p, self.interrupted, meanwhile)
        self.activity = "training"

    # -- the loop ------------------------------------------------------------

    def _phase(self, name: str) -> None:
        """Phase `name` ended now: marked, and logged with its seconds."""
        self.clock.mark(name, time.time())
        seconds = self.clock.breakdown().get(name)
        log.info("island %s epoch %d: phase %s done%s", self.name, self.epoch, name,
                 "" if seconds is None else f" in {seconds:.3f} s")

    def _corpus(self) -> Corpus:
        """The run's corpus: one a standby already opened as the run's, or opened now."""
        data = self.config.data
        corpus = self.corpora.get(corpus_key(data))
        if corpus is None:
            corpus = run_corpus(data, data_dir())
        if data.tokenizer != BYTES:  # every island and syncd tokenize alike, or none trains
            check_tokenizer(corpus.tokenizer_sha256,
                            self.store.claim_tokenizer(corpus.tokenizer_sha256))
        return corpus

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

            self.island = self.pulling.pull_all(len(fragments), build, self._phase)
        cursor = self.store.signals.cursor(self.name)
        if cursor:
            self.island.move_to(cursor["step"], cursor["tokens"])
            state = torch.frombuffer(bytearray(base64.b64decode(cursor["rng"])), dtype=torch.uint8)
            self.island.sampler.set_state(state)
        # The tend thread writes the cursor up to a quarter second after its send: an
        # epoch killed in between left one older than what syncd handled of its
        # updates. syncd refuses an update whose seq it handled (a duplicate), and
        # elastic's barrier would wait for it for ever: so the island starts past the
        # newest seq syncd handled of it, its data cursor that much behind.
        newest = max(self.store.globals.handled_seqs(range(len(fragments)), self.name).values())
        if newest >= self.island.step:
            self.island.move_to(newest, self.island.tokens)
        if self.elastic:
            self.join_restart(self.restarts.until())
        if self.group:
            self.group.share_start(self.island)
        self.sending.open(max_pending=2 * len(fragments))
        self._phase("pull")

    def done(self) -> bool:
        """Whether syncd marked the run done, as the tend thread last read it."""
        return self.tending.done()

    def run_ended(self) -> bool:
        """Whether the run is over for good (done, or no longer active: stopped or
        deleted, its state freed)."""
        return self.store.control.done() or not self.store.is_active()

    def send(self, p: int, mix_at: dict | None = None) -> None:
        self.island.finish_encoding()  # the last send is kept (sending.sent) before this one
        self.hold_back(p, mix_at)
        self.sending.send(self.island, p, self.compute_s)
        self.tending.keep_cursor(self.island)

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
        self.island.inner_step()
        elapsed = time.time() - started
        slow = self.emulation.slowdown()
        if slow > 1.0:
            time.sleep(elapsed * (slow - 1.0))
        self.compute_s += time.time() - started

    def run(self) -> int:
        self.setup()
        # The loop's Redis reads and writes are the tend thread's (TEND_S): a step, an
        # encode or a mix of a big model, however long, does not hold up a heartbeat.
        # Its first tend is now, so that the loop's first steps read nothing either.
        self.tending.tend()
        with beating(self.tending.tend, TEND_S, name="tend"):
            self.train()
        return self.finish()

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
                self.startup_s = max(time.time() - self.started, 0.0)
                self.phases = self.clock.breakdown()
                # The first "training" heartbeat goes out at once, with no throttle.
                self.beat("training", force=True)
            self.sending.send_again()
            if not self.mix(mix_at):
                continue  # a whole-job restart, followed before the next step
            for p in due_fragments(self.island.step, s.inner_steps, s.fragments):
                self.send(p, mix_at)
                seq = self.island.step
                self.pulling.request(p, seq)
                tau = s.overlap_steps if self.elastic else self.tending.tau(s.overlap_steps)
                last, self.trained_at_send = self.trained_at_send, self.compute_s
                limit = (self.compute_s - last) * s.fragments if last and s.overlap_steps else None
                if tau == 0:
                    self.wait(p, seq, mix_at, limit)
                else:
                    mix_at.setdefault(p, (seq + tau, seq))

    def finish(self) -> int:
        """The loop ended: flush a user's stop, tell the other ranks, drain the link."""
        if self.stopping and self.store.control.stop_requested() is not None:
            self.flush()
        if self.group:
            self.group.announce_stop()
            self.group.close(self.island)
        self.island.finish_encoding()
        self.tending.write_cursor()
        self.sending.close(discard=self.done())  # done: its Redis keys are freed already
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
    redis_url = text(REDIS_URL_ENV)
    if not redis_url:
        parser.error(f"the Redis URL must be in the environment variable {REDIS_URL_ENV}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    torch.set_num_threads(1)  # several islands share a host's cores
    return_large_frees(keep_heap=True)
    group = None
    if whole("WORLD_SIZE", 1) > 1:
        group = IslandGroup.from_env(args.device or "auto")
        if group.rank > 0:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # rank 0 says when to stop
            log.info("island %s rank %d of %d on %s", args.island, group.rank,
                     group.world_size, group.device)
            exit_now(follow_rank(group, args.island))
    dataplane_url = text(DATAPLANE_URL_ENV, redis_url)
    store = island_store(redis_url, dataplane_url, args.run)
    island = ProcessIsland(store, args.island, args.epoch, args.device, group, rss_bytes())

    def stop(signum: int, frame: object) -> None:
        island.stop()

    signal.signal(signal.SIGTERM, stop)
    log.info("island %s epoch %d of run %s starting on %s", args.island, args.epoch, args.run,
             island.device)
    exit_now(island.run())


def rss_bytes() -> int:
    """This process's resident memory now."""
    return psutil.Process().memory_info().rss


if __name__ == "__main__":
    main()
