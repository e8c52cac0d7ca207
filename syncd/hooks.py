"""What syncd asks of the side that starts it: its records, its rejoins, its pushes.

syncd knows Redis and the method, not the database or the pages. The web app
implements these (webapp/runs/records.py, webapp/runs/syncd_wiring.py) and plugs them
in when it starts syncd (`manage.py syncd`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol


class Recorder(Protocol):
    """The rows of one run that syncd writes: events, island states, the history,
    progress, checkpoints and the run's end. Writes are batched until flush()."""

    events: list[dict[str, Any]]  # events not yet flushed, each {kind, island, detail, ...}

    def event(self, kind: str, island: str | None = None, **detail: Any) -> None: ...

    def island(self, name: str, **fields: Any) -> None: ...

    def metric(self, status: dict[str, Any], now: float) -> None: ...

    def progress(self, tokens: int, outer_steps: int, progress: float) -> None: ...

    def flush(self) -> None: ...

    def checkpoint(self, versions: list[int], path: str, sha256: str, nbytes: int,
                   eval_loss: float | None, keep: int) -> list[str]: ...

    def checkpoint_evaluated(self, path: str, eval_loss: float) -> None: ...

    def checkpoints(self) -> list[tuple[str, str]]: ...

    def recover_merges(self, versions: dict[int, int], tokens: dict[int, int]) -> list[int]: ...

    def end(self, state: str) -> None: ...


@dataclass(frozen=True)
class Hooks:
    """The web side's part of a syncd.

    Args:
        recorder: the Recorder of a run id.
        rejoin: starts the next epoch of (run id, island): a chaos kill's end.
        notify: pushes (run id, sequence number, status) to the run's live pages.
    """

    recorder: Callable[[int], Recorder]
    rejoin: Callable[[int, str], None]
    notify: Callable[[str, int, dict[str, Any]], None] | None = None
