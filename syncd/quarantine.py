"""Stream entries that speak for no island: quarantined, not replayed.

An entry of a run's update stream that cannot be parsed, names no island or
fragment of the run, or whose message is not shown to be the update it claims
(syncd.ingest.Unverified) is skipped once and for good: it is deleted from the
stream under the run's lease, so that neither a restart of syncd nor a rebuild
of the run reads it again. Nothing else is done in its name: no handled seq, no
deletion of a message, no rejection counted for an island, no lost time booked.
It leaves one "rejection" event per cause (repeated ones aggregated into one event
every AGGREGATE_S, with their count) and one log line as often.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from syncd.hooks import Recorder
    from syncd.update_stream import UpdateStream

log = logging.getLogger("archipelago.syncd")
AGGREGATE_S = 60.0  # repeated quarantines of one cause make one event this often
MAX_CAUSES = 64  # causes tracked at once; more are counted as "other"


@dataclass
class _Cause:
    reason: str  # the first entry's reason, as shown
    island: str | None
    count: int = 0  # entries since the last event
    next_event: float = 0.0


@dataclass
class Quarantine:
    """The quarantined entries of one run.

    Args:
        store: the run's update stream (its lease fences the deletions).
        recorder: the run's rows.
    """

    store: UpdateStream
    recorder: Recorder
    pending: list[bytes] = field(default_factory=list)
    causes: dict[str, _Cause] = field(default_factory=dict)
    total: int = 0

    def add(self, stream_id: bytes, cause: str, reason: str, island: str | None) -> None:
        """Quarantine one entry: `cause` groups it with its likes, `reason` says why;
        `island` is the run's island it named, if any."""
        self.pending.append(stream_id)
        self.total += 1
        if cause not in self.causes and len(self.causes) >= MAX_CAUSES:
            cause = "other"
        entry = self.causes.setdefault(cause, _Cause(reason, island))
        entry.count += 1

    def settle(self, now: float) -> None:
        """Delete the entries quarantined since the last call from the stream, and record
        the causes that are due an event."""
        if self.pending:
            self.store.forget_entries(self.pending)
            self.pending = []
        for cause, entry in self.causes.items():
            if entry.count and now >= entry.next_event:
                log.warning("run %s: quarantined %d stream entries (%s): %s",
                            self.store.run_id, entry.count, cause, entry.reason)
                self.recorder.event("rejection", entry.island, reason=entry.reason,
                                    cause=cause, quarantined=entry.count)
                entry.count = 0
                entry.next_event = now + AGGREGATE_S
