"""How syncd recovers a run: checkpoints, the elastic whole-job restart, and the
fall-back to the newest checkpoint when Redis lost a run's state.

`Recovery` owns the checkpoints' schedule, the elastic restore point and the
start-ups the restart delay is measured from; it changes the rounds only through
their methods (Synchronizer.load, Publisher.publish, Rounds.roll_back).
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from diloco.tokenizer import BYTES, Tokenizer, check_tokenizer
from syncd import checkpoint
from syncd.corpus import RunCorpus
from syncd.environment import data_dir

if TYPE_CHECKING:
    from diloco.accounting import RunAccounting
    from syncd.hooks import Recorder
    from syncd.liveness import Liveness
    from syncd.records import Heartbeat
    from syncd.rounds import Rounds
    from syncd.spec import RunSpec
    from syncd.store import RunStore

log = logging.getLogger("archipelago.syncd")
DEFAULT_RESTART_DELAY_S = 5.0


class Recovery:
    """Args:
        store: the run's Redis keys.
        recorder: the run's rows (checkpoints, rollback and checkpoint events).
        spec: the run's spec.
        accounting: the run's goodput, told of what a restart or a new epoch
            throws away.
        checkpoint_dir: where this run's checkpoints go.
        clock: the time source (seconds).
        corpus: the run's corpus, prepared in the background (syncd/corpus.py); default
            one of its own, in syncd's data directory.
    """

    def __init__(self, store: RunStore, recorder: Recorder, spec: RunSpec,
                 accounting: RunAccounting, checkpoint_dir: Path, clock: Callable[[], float],
                 corpus: RunCorpus | None = None):
        self.store = store
        self.corpus = corpus or RunCorpus(spec.config.data, data_dir())
        self.recorder = recorder
        self.spec = spec
        self.accounting = accounting
        self.checkpoint_dir = checkpoint_dir
        self.clock = clock
        self.next_checkpoint = clock() + spec.config.checkpoint.interval_s
        self.checkpoint_asked = False
        # Elastic: the globals and momentum a whole-job restart goes back to, when they
        # were taken and the tokens merged by then.
        self.restore_point: tuple[list[dict], list[dict]] | None = None
        self.restore_time = clock()
        self.restore_tokens: dict[int, int] = {}
        self.first_startups: dict[str, float] = {}  # island -> seconds
        self.tokenizer: str | None = None  # the run's tokenizer.json, once read (not bytes)

    def fall_back_to_checkpoint(self, rounds: Rounds) -> bool:
        """Redis lost the run's published versions (its data is really gone): go on
        from the newest checkpoint that verifies, as a declared rollback."""
        for path, sha256 in self.recorder.checkpoints():
            try:
                params, momentum, versions, tokens = checkpoint.load(Path(path), sha256)
            except (OSError, ValueError) as exc:
                log.warning("run %s: checkpoint %s is unusable: %s", self.store.run_id, path,
                            exc)
                continue
            for p, fragment in enumerate(rounds.fragments):
                # Published as the version after the checkpoint's, so that no island
                # that held the checkpoint's versions sees them go backwards.
                rounds.sync.load(p, {n: params[n] for n in fragment.tensor_names},
                                 {k.removeprefix(f"{p}."): v for k, v in momentum.items()
                                  if k.startswith(f"{p}.")}, versions[p] + 1)
                rounds.publisher.publish(p, tokens)
            self.recorder.event("rollback", None, reason="Redis lost the run's state",
                                checkpoint=path, versions=rounds.sync.versions())
            log.warning("run %s: Redis had no versions; rolled back to %s", self.store.run_id,
                        path)
            return True
        return False

    # -- checkpoints -----------------------------------------------------------

    def ask_for_checkpoint(self) -> None:
        """A user asked for a checkpoint: one is written at the next `checkpoint_if_due`."""
        self.checkpoint_asked = True

    def checkpoint_if_due(self, now: float, rounds: Rounds, eval_loss: float | None) -> None:
        """Every checkpoint.interval_s, and when one was asked for; deferred to a later
        tick while the corpus whose tokenizer it carries is being prepared."""
        if (now >= self.next_checkpoint or self.checkpoint_asked) and self.tokenizer_ready():
            self.next_checkpoint = now + self.spec.config.checkpoint.interval_s
            self.checkpoint_asked = False
            self.save_checkpoint(rounds, eval_loss)

    def save_checkpoint(self, rounds: Rounds, eval_loss: float | None) -> str:
        """Write the global model, its outer momentum and versions (with the eval loss
        of the model, for the Checkpoint row), and forget the oldest beyond `keep`;
        returns the checkpoint's path."""
        sync = rounds.sync
        versions = sync.versions()
        momentum = {f"{p}.{k}": v for p, opt in enumerate(sync.optimizers)
                    for k, v in opt.state_dict().items()}
        path = self.checkpoint_dir / f"run-{self.store.run_id}" / (
            f"outer-{min(versions)}-{int(self.clock() * 1000)}.safetensors")
        sha, nbytes = checkpoint.save(path, sync.global_params(), momentum, versions,
                                      rounds.tokens_merged(), self.run_tokenizer())
        for old in self.recorder.checkpoint(versions, str(path), sha, nbytes, eval_loss,
                                            self.spec.config.checkpoint.keep):
            Path(old).unlink(missing_ok=True)
        self.recorder.event("checkpoint", None, versions=versions, sha256=sha, bytes=nbytes)
        return str(path)

    def tokenizer_ready(self) -> bool:
        """Whether a checkpoint can be written without waiting for the corpus: the run's
        tokenizer is bytes or read, or its corpus prepared (started here if not)."""
        if self.tokenizer is not None or self.spec.config.data.tokenizer == BYTES:
            return True
        self.corpus.start()
        return self.corpus.ready()

    def run_tokenizer(self) -> str | None:
        """The run's tokenizer.json, which every checkpoint carries (None for bytes): read
        once from the prepared corpus (waits for its preparation)."""
        if self.tokenizer is None and self.spec.config.data.tokenizer != BYTES:
            text = self.corpus.get().tokenizer_json() or ""
            mine = Tokenizer(text).sha256
            check_tokenizer(mine, self.store.claim_tokenizer(mine))
            self.tokenizer = text
        return self.tokenizer

    # -- the elastic baseline ----------------------------------------------------

    def mark_restore_point(self, now: float, rounds: Rounds, eval_loss: float | None) -> None:
        """Elastic: after an outer step, the state a whole-job restart goes back to, and
        its checkpoint."""
        # Copies: the outer optimizer's step updates its momentum buffers in place (mul_,
        # add_), so its state_dict's tensors would move on with the next outer step.
        self.restore_point = (
            [{n: t.clone() for n, t in g.items()} for g in rounds.sync.globals],
            [{k: v.clone() for k, v in opt.state_dict().items()}
             for opt in rounds.sync.optimizers])
        self.restore_time = now
        self.restore_tokens = self.store.globals.tokens_merged()
        self.save_checkpoint(rounds, eval_loss)

    def note_first_startups(self, heartbeats: dict[str, Heartbeat]) -> None:
        """Keep the start-up each island's first epoch reported (elastic's delay)."""
        for island, beat in heartbeats.items():
            if island not in self.first_startups and beat.startup_s:
                self.first_startups[island] = float(beat.startup_s)

    def restart_delay(self, heartbeats: dict[str, Heartbeat]) -> float:
        """elastic.restart_delay_s, or the measured time for the job to start: a
        whole-job restart starts every island at once, and the barrier goes on when the
        slowest is back, so it is the longest start-up (launch to first step) of the
        islands' first epochs, which started together (the first this syncd saw).
        Until each has reported one, the median start-up any epoch reported (in
        `heartbeats`)."""
        config = self.spec.config
        if config.elastic.restart_delay_s is not None:
            return config.elastic.restart_delay_s
        if self.first_startups and set(self.first_startups) >= self.spec.island_names():
            return max(self.first_startups.values())
        measured = [b.startup_s for b in heartbeats.values() if b.startup_s]
        return statistics.median(measured) if measured else DEFAULT_RESTART_DELAY_S

    def account_new_epochs(self, epochs: dict[str, int], liveness: Liveness,
                                 rounds: Rounds) -> None:
        """An island whose epoch moved on (`epochs`, against the ones `liveness` has) lost
        the work its old epoch had not sent: island-seconds lost "in_flight", at
        its fault-free step time."""
        for island, epoch in epochs.items():
            old = liveness.epochs.get(island)
            beat = liveness.heartbeats.get(island)
            if old is None or epoch <= old or island not in self.accounting.islands \
                    or not beat or beat.epoch > old:
                continue
            seconds = unsent_steps(beat, rounds.ingester.sent_seqs(island)) * (
                self.accounting.step_time(island) or 0.0)
            self.accounting.lost(island, seconds, "in_flight")

    def restart_job(self, now: float, island: str, rounds: Rounds, liveness: Liveness, *,
                    joining: bool = False) -> None:
        """Elastic: every island rolls back to the last checkpoint and pauses for the
        restart delay, as a whole-job restart would make it. torchelastic restarts every
        worker on any change of membership: when `island` is lost, and again when it
        comes back (`joining`); an island lost or back while a restart is under way
        joins that one.

        Lost to "rollback": the merges since the checkpoint (taken back, and their tokens
        no longer count towards the budget), the updates waiting in the open rounds and
        each other island's work since its last sends; to "barrier_wait": how long each
        had waited at the barrier for the lost island; to "restart_pause": each other
        island's pause. The joining island's own start-up overlaps the pause, and it
        follows the restart like the others.
        """
        if now < self.store.control.restart()[1]:
            return
        sync = rounds.sync
        if self.restore_point is None:
            params: list[dict[str, torch.Tensor]] = [
                {n: t.clone() for n, t in g.items()} for g in sync.globals]
            momentum = [opt.state_dict() for opt in sync.optimizers]
            kept = self.store.globals.tokens_merged()
        else:
            params, momentum = self.restore_point
            kept = self.restore_tokens
        merged = self.store.globals.tokens_merged()
        others = [i.name for i in self.spec.config.islands if i.name != island
                  and i.name not in liveness.lost and i.name in self.accounting.islands]
        thrown = {name: unsent_steps(liveness.heartbeats.get(name), rounds.ingester.sent_seqs(name))
                  for name in others}
        waited = dict.fromkeys(others, 0.0)  # an island waits at one barrier at a time
        discarded = set()
        fragments = len(rounds.fragments)
        for p in range(fragments):
            for name, seconds in rounds.barrier_waits(p, now).items():
                if name in waited:
                    waited[name] = max(waited[name], seconds)
            for name, pending in sync.open_round(p).items():
                if name in thrown:
                    thrown[name] += pending.contribution.inner_steps / fragments
            discarded.update(rounds.roll_back(p, params[p], momentum[p], now,
                                              kept.get(p, 0) - merged.get(p, 0)))
        delay = self.restart_delay(liveness.heartbeats)
        restarts = self.store.control.restart_job(now + delay)
        liveness.hold_up_run(now + delay)  # no island's step time spans the pause
        self.accounting.rollback(self.restore_time, now)
        for name in others:
            self.accounting.lost(name, delay, "restart_pause")
            self.accounting.lost(name, waited[name], "barrier_wait")
            self.accounting.lost(name, thrown[name] * (self.accounting.step_time(name) or 0.0),
                                 "rollback")
        self.recorder.event("rollback", island, versions=sync.versions(),
                            reason="island joined" if joining else "island lost",
                            restart_delay_s=round(delay, 2), generation=restarts,
                            discarded=sorted(discarded))


def unsent_steps(beat: Heartbeat | None, sent: list[int]) -> float:
    """Inner steps of an island since the last update of each fragment that syncd
    received (`sent`: their seqs, Ingester.sent_seqs), as goodput counts them (a
    fragment stands for 1/P of a step), up to its last heartbeat `beat`: the work a
    death or a restart of the island throws away."""
    if not beat:
        return 0.0
    return sum(max(beat.step - seq, 0) for seq in sent) / len(sent)
