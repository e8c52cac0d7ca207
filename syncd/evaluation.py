"""Evaluation of the global model while a run trains, so the control room's eval loss
moves with it, and once more at the end.

Every `eval.interval_steps` global inner steps (outer_steps x H), at most once per
MIN_GAP_S of syncd's clock, and within a CPU budget: an evaluation that took c CPU
seconds lets the next one start only c / (cpu_share x cores) seconds after it began,
so that live evaluation takes at most `cpu_share` of the host's CPU on average
(SYNCD_EVAL_CPU_SHARE), however large the model or `eval.tokens` (the CPU time
counted is the evaluation thread's: all of its torch work at SYNCD_THREADS = 1).
While the run trains, an evaluation runs in a thread of its own on the global
parameters of that moment (the tensors themselves: a merge makes new ones, so only
the fragments merged during the evaluation are held twice), so merges never wait
behind it; the loss is picked up on a later tick. The final one, at the budget, runs
in line. The batches are read once, from the validation split: what a run shows and
what its settings are tuned by is never the test split that the benchmarks report
(diloco/data.py). Each loss is in nats per token and in bits per byte, divided by the
prepared corpus' bytes of text per token of the validation split it evaluates
(diloco.data.bytes_per_token: measured on that split's text; 1 for bytes).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

import torch

from diloco.config import RunConfig
from syncd.corpus import RunCorpus
from syncd.environment import data_dir

MIN_GAP_S = 5.0
# The share of the host's CPU live evaluation may take on average (SYNCD_EVAL_CPU_SHARE).
EVAL_CPU_SHARE = 0.02


def host_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class GlobalEval:
    """Args:
        config: the run's config (model, data, eval and H).
        min_gap_s: the least time between two evaluations on syncd's clock.
        cpu_share: the share of the host's CPU (0 to 1) live evaluation takes on average.
        cores: the host's cores; default those this process may run on.
        corpus: the run's corpus, prepared in the background (syncd/corpus.py); default
            one of its own, in syncd's data directory.
    """

    def __init__(self, config: RunConfig, min_gap_s: float = MIN_GAP_S,
                 cpu_share: float = EVAL_CPU_SHARE, cores: int | None = None,
                 corpus: RunCorpus | None = None):
        if not 0 < cpu_share <= 1:
            raise ValueError(f"cpu_share must be above 0 and at most 1, got {cpu_share}")
        self.config = config
        self.corpus = corpus or RunCorpus(config.data, data_dir())
        self.min_gap_s = min_gap_s
        self.cpu_per_s = cpu_share * (cores or host_cores())  # CPU seconds per second
        self.next_step = config.eval.interval_steps
        self.next_time = 0.0
        self.started_at = 0.0  # syncd's clock when the last evaluation was due
        self.cpu_s = 0.0  # CPU seconds the last background evaluation took
        self._evaluator: Callable[[dict[str, torch.Tensor]], float] | None = None
        self._thread: threading.Thread | None = None
        self._result: float | None = None
        self._lock = threading.Lock()
        # One evaluation at a time: the final one, in line, must not share the model
        # with a background one still running (the model takes each call's tensors).
        self._evaluating = threading.Lock()

    def due(self, outer_steps: int, now: float) -> bool:
        """Whether an evaluation is due at `outer_steps` (the smallest fragment version)."""
        step = outer_steps * self.config.sync.inner_steps
        if step < self.next_step or now < self.next_time or now < self.budget_until():
            return False
        self.next_step = step + self.config.eval.interval_steps
        self.next_time = now + self.min_gap_s
        self.started_at = now
        return True

    def budget_until(self) -> float:
        """When the CPU budget lets the next evaluation start (syncd's clock)."""
        with self._lock:
            spent = self.cpu_s
        return self.started_at + spent / self.cpu_per_s

    def start(self, params: dict[str, torch.Tensor]) -> bool:
        """Evaluate `params` in the background; False if one is still running. The
        tensors must not change in place meanwhile (the synchronizer's merges replace
        them)."""
        if self._thread is not None and self._thread.is_alive():
            return False
        snapshot = dict(params)

        def run() -> None:
            began = time.thread_time()
            loss = self(snapshot)
            with self._lock:
                self._result = loss
                self.cpu_s = time.thread_time() - began

        self._thread = threading.Thread(target=run, name="evaluation", daemon=True)
        self._thread.start()
        return True

    def wait(self, timeout: float) -> None:
        """Wait up to `timeout` seconds for the background evaluation to finish."""
        if self._thread is not None:
            self._thread.join(timeout)

    def result(self) -> float | None:
        """The loss of the last background evaluation that finished since the last call."""
        with self._lock:
            loss, self._result = self._result, None
        return loss

    def bits_per_byte(self, loss: float) -> float:
        """`loss`, one of this evaluator's (nats per token), in bits per byte of the text."""
        from diloco.evaluation import bits_per_byte

        evaluator = self._evaluator
        return bits_per_byte(loss, evaluator.bytes_per_token if evaluator else 1.0)

    def __call__(self, params: dict[str, torch.Tensor]) -> float:
        """The eval loss of `params` on the run's validation split; waits for an
        evaluation still running in the background."""
        with self._evaluating:
            if self._evaluator is None:
                from diloco.evaluation import Evaluator

                self._evaluator = Evaluator(self.config, self.corpus.get(), "validation")
            return self._evaluator(params)
