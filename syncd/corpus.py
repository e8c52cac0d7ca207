"""A run's prepared corpus, as syncd reads it: prepared (a `train` tokenizer trained)
in a thread of its own, so that the loop serving every run of this syncd never waits
on it. The evaluation reads the corpus from it, and a checkpoint of a run whose
tokenizer is not bytes waits for it (syncd/recovery.py defers a periodic checkpoint
until it is ready). Islands preparing the same corpus meanwhile wait on its folder's
lock (diloco/data.py) and find the files made. How far the preparation is (the pass,
bytes read of the corpus' bytes, documents, records skipped) is the run's status'
`corpus` (`status`), from the pass's own counts (diloco.documents.Progress).
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

from diloco.data import Corpus, run_corpus
from diloco.documents import Progress
from diloco.tokenizer import BYTES
from syncd.records import CorpusStatus, corpus_waiting

log = logging.getLogger(__name__)


class RunCorpus:
    """Args:
        data: the run's `data` section (diloco.config.DataConfig).
        directory: the data directory the corpus is prepared in.
    """

    def __init__(self, data: Any, directory: Path):
        self.data = data
        self.directory = directory
        self._corpus: Corpus | None = None
        self._error: Exception | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._reported = False
        self._progress: Progress | None = None  # the pass under way, or the last one

    @classmethod
    def of_run(cls, data: Any, directory: Path) -> RunCorpus:
        """The corpus of a run syncd takes on, begun at once when its tokenizer is not
        bytes (its checkpoints carry the tokenizer); else at the first evaluation."""
        corpus = cls(data, directory)
        if data.tokenizer != BYTES:
            corpus.start()
        return corpus

    def start(self) -> None:
        """Begin preparing in the background, once."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._prepare, name="corpus",
                                                daemon=True)
                self._thread.start()

    def _prepare(self) -> None:
        try:
            self._corpus = run_corpus(self.data, self.directory, watch=self._watch)
        except Exception as exc:  # handed to whoever reads the corpus
            log.warning("corpus %s could not be prepared: %s", self.data.path, exc)
            self._error = exc

    def _watch(self, progress: Progress) -> None:
        self._progress = progress

    def status(self) -> CorpusStatus:
        """Where the corpus' preparation is: waiting (not begun), preparing, ready or
        failed; the counts of its current (or last) pass, zeros where no pass ran (the
        prepared files were current)."""
        status = corpus_waiting()
        if self._thread is None:
            return status
        if self._progress is not None:
            status.update(self._progress.snapshot())
        if not self.ready():
            status["state"] = "preparing"
        elif self._error is not None:
            status.update(state="failed", error=str(self._error))
        else:
            status["state"] = "ready"
        return status

    def ready(self) -> bool:
        """Whether the corpus is prepared (or failed to be): reading it waits no more."""
        return self._thread is not None and not self._thread.is_alive()

    def report(self) -> dict[str, Any] | None:
        """Once the corpus is prepared, the first call's: the detail of an alert event
        naming the records its preparation skipped (how many, why, the first few by
        file and line), or None when it skipped none; None before, and after."""
        if self._reported or not self.ready() or self._corpus is None:
            return None
        self._reported = True
        skipped = self._corpus.meta.get("skipped_records") or {}
        counts = {why: skipped.get(key, 0) for key, why in (
            ("bad_json", "not JSON"), ("no_text", f"without text in {self.data.text_field!r}"),
            ("binary_files", "binary files"))}
        if not any(counts.values()):
            return None
        return {"message": f"corpus {self.data.path}: skipped " + ", ".join(
                    f"{n} {why}" for why, n in counts.items() if n)
                + " (" + "; ".join(skipped.get("examples", [])) + ")",
                "skipped_records": skipped}

    def get(self) -> Corpus:
        """The corpus, prepared first if it is not (waits); raises what preparing raised."""
        self.start()
        assert self._thread is not None
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._corpus is not None
        return self._corpus
