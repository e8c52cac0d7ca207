"""Evaluation of the global model while a run trains, so the control room's eval loss
moves with it, and once more at the end.

Every `eval.interval_steps` global inner steps (outer_steps x H), at most once per
MIN_GAP_S of syncd's clock. While the run trains, an evaluation runs in a thread of
its own on the global parameters of that moment (the tensors themselves: a merge
makes new ones, so only the fragments merged during the evaluation are held twice),
so merges never wait behind it; the loss is picked up on a later tick. The final
one, at the budget, runs in line. The batches are read once, from the validation
split: what a run shows and what its settings are tuned by is never the test split
that the benchmarks report (diloco/data.py).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch

from diloco.config import RunConfig

MIN_GAP_S = 5.0


class GlobalEval:
    """Args:
        config: the run's config (model, data, eval and H).
        min_gap_s: the least time between two evaluations on syncd's clock.
    """

    def __init__(self, config: RunConfig, min_gap_s: float = MIN_GAP_S):
        self.config = config
        self.min_gap_s = min_gap_s
        self.next_step = config.eval.interval_steps
        self.next_time = 0.0
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
        if step < self.next_step or now < self.next_time:
            return False
        self.next_step = step + self.config.eval.interval_steps
        self.next_time = now + self.min_gap_s
        return True

    def start(self, params: dict[str, torch.Tensor]) -> bool:
        """Evaluate `params` in the background; False if one is still running. The
        tensors must not change in place meanwhile (the synchronizer's merges replace
        them)."""
        if self._thread is not None and self._thread.is_alive():
            return False
        snapshot = dict(params)

        def run() -> None:
            loss = self(snapshot)
            with self._lock:
                self._result = loss

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

    def __call__(self, params: dict[str, torch.Tensor]) -> float:
        """The eval loss of `params` on the run's validation split; waits for an
        evaluation still running in the background."""
        with self._evaluating:
            if self._evaluator is None:
                from diloco.data import load_corpus
                from diloco.evaluation import Evaluator

                corpus = load_corpus(self.config.data.path, self.config.data.eval_fraction)
                self._evaluator = Evaluator(self.config, corpus, "validation")
            return self._evaluator(params)
