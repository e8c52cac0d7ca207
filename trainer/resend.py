"""What an island sent and syncd has not handled yet, kept to send again to a restarted
syncd.

syncd folds each update into its round's sum as it arrives and deletes its message
(syncd/rounds.py), so a syncd that restarts mid-round has lost its open rounds. The
rule: an island keeps each message it sent until the published handled seqs say
syncd merged or dropped it, at most `keep` per fragment (the oldest goes
first: its steps are lost, as a refused update's are), and sends the ones kept
again when syncd's lease on the run changes hands (a new fencing token: a syncd
that took the run over, a restarted one included, holds none of the open rounds).
Sending again is safe: an update is one key per (island, epoch, fragment, seq),
and syncd skips one whose seq is handled or already in its round, so no update is
merged twice (docs/RELIABILITY.md).

The same messages are the backpressure bound: with `keep` of a fragment not
handled, the island waits before its next send of it (`must_wait`), so none is pushed
out and Redis gets no more of them while syncd merges none (only a stop's last sends go
past it, one per fragment).
"""

from __future__ import annotations

from collections.abc import Callable


class SentUpdates:
    """The messages an island sent that syncd has not handled yet.

    Args:
        handled: the newest handled seq of fragment p (GlobalsStore.handled_seq).
        holder: the value of syncd's lease on the run now ("<token>:<owner>"), None
            while no syncd holds it.
        keep: messages kept per fragment at most (diloco.sizes.kept_sends of the run's
            uplink codec: at least one in an open round and one on the way while the
            tau overlap steps run; the run's memory estimate counts them).
    """

    def __init__(self, handled: Callable[[int], int], holder: Callable[[], str | None],
                 keep: int):
        if keep < 1:
            raise ValueError(f"keep must be at least 1 message per fragment, got {keep}")
        self.handled = handled
        self.holder = holder
        self.keep = keep
        self.sent: dict[int, list[tuple[int, bytes | bytearray]]] = {}
        self.seen: str | None = None  # the lease's holder when the island last looked

    def add(self, fragment: int, seq: int, message: bytes | bytearray) -> None:
        """A message handed to the link (kept by reference: no copy)."""
        kept = self.sent.setdefault(fragment, [])
        kept.append((seq, message))
        del kept[:-self.keep]
        if self.seen is None:
            self.seen = self.holder()

    def fragments(self) -> list[int]:
        """The fragments of which messages are kept."""
        return list(self.sent)

    def unhandled(self, fragment: int) -> int:
        """How many of the fragment's kept messages syncd has not handled yet (forgets
        the handled ones)."""
        done = self.handled(fragment)
        kept = self.sent.get(fragment, [])
        kept[:] = [(seq, m) for seq, m in kept if seq > done]
        return len(kept)

    def must_wait(self, fragment: int) -> bool:
        """Backpressure: whether the island's next send of `fragment` must wait for syncd
        to handle more. It must once `keep` of them are not handled: the next would push
        out a kept one, and put one more in Redis while syncd merges none. A healthy
        island never waits: its update is merged within about one cadence (H steps),
        before its next send of the fragment."""
        return self.unhandled(fragment) >= self.keep

    def to_send_again(self) -> list[tuple[int, int, bytes | bytearray]]:
        """(fragment, seq, message) of each message kept and not handled, if syncd's
        lease changed hands since the island last looked; [] otherwise. Forgets the
        handled ones."""
        holder = self.holder()
        if holder is None or holder == self.seen:
            return []
        self.seen = holder
        out = []
        for fragment, kept in self.sent.items():
            done = self.handled(fragment)
            kept[:] = [(seq, m) for seq, m in kept if seq > done]
            out.extend((fragment, seq, m) for seq, m in kept)
        return out
