"""The synchronizer's state for one run: global fragments, rounds and versions.

This is the part of syncd that decides and merges, with no Redis, database or
clock of its own: syncd and the in-process cluster both feed it
decoded updates and the current time. For each fragment it keeps the global
parameters, their version, an outer optimizer, the open round (each update folded
into its round sum as it arrives, diloco/fold.py, and per island only scalars, so
the caller may drop an update once it is submitted), and the recent published
versions that islands pull.

Downlink: with codec "none" a published version is the fragment itself. With a
lossy codec it is the encoded difference to the previous version, and the
synchronizer's own global becomes exactly what the islands reconstruct
(previous + decoded difference), so islands and synchronizer never drift
apart and the codec's error is not compounded.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import torch

from diloco import codecs
from diloco.config import OptimConfig, SyncConfig
from diloco.fold import Contribution, RoundSum
from diloco.fragments import Fragment, sync_offset
from diloco.merge import OuterOptimizer, Update
from diloco.policy import Arrival, Decision, RoundStats, decide, is_stale
from diloco.staleness import age_gate

# sync.merge_each_period: a round waits for the islands expected within this many periods
# of its first arrival, up to this share of a period past when each is expected.
PERIOD_REACH = 1.5
EXPECTED_SLACK = 0.25


@dataclass
class Published:
    version: int
    time: float
    codec: str  # "none": the full fragment; otherwise a difference to version - 1
    payload: dict[str, torch.Tensor]


@dataclass
class MergeResult:
    fragment: int
    version: int
    time: float
    weights: dict[str, float]
    tokens: int
    inner_steps: dict[str, int]
    seqs: dict[str, int] = field(default_factory=dict)  # each update's last inner step
    # each update's age: versions published between its anchor and this merge's base
    # (diloco/staleness.py); an island's increments count from the oldest anchor
    ages: dict[str, int] = field(default_factory=dict)


@dataclass
class Pending:
    """An island's place in an open round: what it contributed, and when its first
    increment arrived (the round's clock counts from there)."""

    contribution: Contribution
    arrival_time: float
    gate: float = 1.0  # its age's share (diloco.staleness.age_gate), fixed by its first


class Synchronizer:
    """Global fragments of one run and the rounds that merge into them.

    Args:
        params: the initial global parameters (name -> tensor).
        fragments: the partition the islands use.
        sync: quorum, grace, weighting, RDA, codec and staleness settings.
        optim: outer learning rate and momentum.
        embedding_names: tensors RDA leaves alone.
    """

    def __init__(self, params: dict[str, torch.Tensor], fragments: list[Fragment],
                 sync: SyncConfig, optim: OptimConfig, round_tokens: int,
                 embedding_names: tuple[str, ...] = ()):
        self.fragments = fragments
        self.round_tokens = round_tokens
        self.sync = sync
        self.embedding_names = embedding_names
        self.globals = [{n: params[n].detach().float().clone() for n in f.tensor_names}
                        for f in fragments]
        self.shapes = [{n: tuple(t.shape) for n, t in g.items()} for g in self.globals]
        self._versions = [0] * len(fragments)
        self.published_at = [0.0] * len(fragments)  # when each newest version was made
        self.optimizers = [OuterOptimizer(optim.outer_lr, optim.outer_momentum)
                           for _ in fragments]
        self._rounds: list[dict[str, Pending]] = [{} for _ in fragments]
        self.sums = [self._round_sum() for _ in fragments]
        # With a lossy downlink, the differences an island up to max_staleness versions
        # behind pulls; with "none" an island always takes the newest fragment whole.
        self.history: list[deque[Published]] = [deque(maxlen=history_length(sync))
                                                for _ in fragments]
        # island -> the newest seq of its updates that a merge took in or dropped
        self._handled_seqs: list[dict[str, int]] = [{} for _ in fragments]
        # island -> when its newest update arrived (when it is expected next)
        self.arrived: list[dict[str, float]] = [{} for _ in fragments]
        self.newest_seq: dict[str, int] = {}  # island -> the newest seq it sent, any fragment

    @property
    def outer_steps(self) -> int:
        """The smallest fragment version: outer steps every fragment has taken."""
        return min(self._versions)

    def _round_sum(self) -> RoundSum:
        return RoundSum(self.sync.weighting, self.sync.rda, self.embedding_names)

    def submit(self, update: Update, fragment: int, now: float) -> str | None:
        """Fold a decoded update into its fragment's round; returns a rejection reason or
        None. The round keeps none of its tensors: the caller may drop it now.

        A second update from an island whose first is still waiting is an
        increment on top of it, so the two add up (at the first one's weight,
        diloco/fold.py says why). Staleness is checked here only: a fragment's
        version moves only with a merge or a rollback, which close its round, so
        nothing in an open round goes stale.
        """
        self.arrived[fragment][update.island] = now
        self.newest_seq[update.island] = max(update.seq, self.newest_seq.get(update.island, 0))
        if is_stale(update.base_version, self._versions[fragment], self.sync.max_staleness):
            self.settle(fragment, update.island, update.seq)
            return (f"stale: based on version {update.base_version}, newest is "
                    f"{self._versions[fragment]}, max_staleness {self.sync.max_staleness}")
        pending = self._rounds[fragment].get(update.island)
        gate = pending.gate if pending is not None else age_gate(
            self._versions[fragment] - update.base_version, self.sync.max_staleness,
            self.sync.staleness_weighting)
        contribution = self.sums[fragment].add(update, gate)
        self._rounds[fragment][update.island] = Pending(
            contribution, now if pending is None else pending.arrival_time, gate)
        return None

    def settle(self, fragment: int, island: str, seq: int) -> None:
        """The island's update `seq` of the fragment is done with (merged into a version,
        dropped or refused): so is every update of it before."""
        handled = self._handled_seqs[fragment]
        handled[island] = max(seq, handled.get(island, -1))

    def has_handled(self, fragment: int, island: str, seq: int) -> bool:
        """Whether the island's update `seq` was merged into a version or dropped."""
        return self._handled_seqs[fragment].get(island, -1) >= seq

    def handled_seq(self, fragment: int, island: str, default: int = -1) -> int:
        """The newest seq of the island's updates of the fragment that a merge took in or
        dropped; `default` before any."""
        return self._handled_seqs[fragment].get(island, default)

    def handled(self, fragment: int) -> dict[str, int]:
        """Island -> its handled seq of the fragment (a copy)."""
        return dict(self._handled_seqs[fragment])

    def restore_handled(self, fragment: int, seqs: dict[str, int]) -> None:
        """Go on from these handled seqs of the fragment (a restarted syncd's, from Redis)."""
        self._handled_seqs[fragment] = seqs

    def done_with(self, fragment: int, island: str, seq: int) -> bool:
        """Whether the island's update `seq` is handled already or in the fragment's open
        round: the same update again, or one before it (nothing is merged twice)."""
        pending = self._rounds[fragment].get(island)
        return seq <= self._handled_seqs[fragment].get(island, -1) or (
            pending is not None and seq <= pending.contribution.seq)

    def version(self, fragment: int) -> int:
        """The fragment's newest version."""
        return self._versions[fragment]

    def versions(self) -> list[int]:
        """Each fragment's newest version (a copy)."""
        return list(self._versions)

    def open_round(self, fragment: int) -> dict[str, Pending]:
        """Island -> its place in the fragment's open round (a copy)."""
        return dict(self._rounds[fragment])

    def use_round_tokens(self, round_tokens: int) -> None:
        """A round's tokens from now on (the run's islands changed)."""
        self.round_tokens = round_tokens

    def load(self, fragment: int, tensors: dict[str, torch.Tensor],
             momentum: dict[str, torch.Tensor] | None, version: int) -> None:
        """Make the fragment's global these tensors at `version`, with this outer momentum
        (None: the optimizer's as it is)."""
        self.globals[fragment] = {n: t.float() for n, t in tensors.items()}
        self._versions[fragment] = version
        if momentum is not None:
            self.optimizers[fragment].load_state_dict(momentum)

    def forget_published(self, fragment: int, version: int) -> None:
        """`version` of the fragment is not published after all (its merge made it
        non-finite): its difference leaves the history."""
        history = self.history[fragment]
        if history and history[-1].version == version:
            history.pop()

    def decide(self, fragment: int, now: float, alive_islands: int, stats: RoundStats,
               barrier: bool = False, waiting: frozenset[str] | None = None) -> Decision:
        """Whether the fragment's round merges now; `barrier` waits for every alive island
        (elastic and sync) instead of the quorum and grace window, which with
        sync.merge_each_period lasts until the islands expected within the period are in
        (`period_ends`). `waiting` (syncd chose tau 0; the islands sending) waits once the
        quorum is in, up to a period (H median steps) from the round's first arrival, for
        each island sending that is training (no update of its in an open round) or whose
        next send is of this fragment (`sends_next`), and for no other: one held in
        another fragment's round waits for that merge, which may wait for the islands
        here; one training is on its way, and waiting for it ends a split into groups
        that each merge their own rounds a few fragments apart."""
        arrivals = [Arrival(i, p.arrival_time, p.contribution.base_version)
                    for i, p in self._rounds[fragment].items()]
        if waiting is not None and arrivals:
            held = {island for pending in self._rounds for island in pending}
            awaited = [island for island in waiting if island not in self._rounds[fragment]
                       and (island not in held or fragment in self.sends_next(island))]
            if len(arrivals) >= self.sync.min_quorum and not awaited:
                return Decision(True, f"every island sending fragment {fragment} next arrived")
            first = min(a.time for a in arrivals)
            return decide(arrivals, now, min_quorum=self.sync.min_quorum,
                          alive_islands=len(arrivals) + len(awaited), gamma=0.0,
                          overlap_steps=0, stats=stats,
                          period_ends=first + self.sync.inner_steps * stats.step_time_s)
        period_ends = None
        if self.sync.merge_each_period and not barrier:
            period_ends = self.period_ends(fragment, stats)
        return decide(arrivals, now,
                      min_quorum=max(alive_islands, 1) if barrier else self.sync.min_quorum,
                      alive_islands=alive_islands, gamma=0.0 if barrier else self.sync.grace_gamma,
                      overlap_steps=self.sync.overlap_steps, stats=stats,
                      period_ends=period_ends)

    def sends_next(self, island: str) -> list[int]:
        """The fragments of the island's next send, after the newest seq it sent (its inner
        steps: every island sends fragment p at the same steps modulo H)."""
        newest, h, n = self.newest_seq.get(island, 0), self.sync.inner_steps, len(self._versions)
        steps_to = {p: (sync_offset(p, h, n) - newest - 1) % h + 1 for p in range(n)}
        soonest = min(steps_to.values())
        return [p for p, steps in steps_to.items() if steps == soonest]

    def period_ends(self, fragment: int, stats: RoundStats) -> float | None:
        """Until when the fragment's open round waits for the islands expected within its
        synchronization period (sync.merge_each_period); None: for none.

        An island not in the round is expected H of its own steps after its newest
        update arrived. The round waits for each one expected within PERIOD_REACH
        periods (H median steps) of its first arrival, up to EXPECTED_SLACK of a period
        past that: every island at the training pace sends once in a period, and the
        slowest of them, which closed the last merge, is due a period of its own steps
        after it, later than a median period (a period counted from the last merge left
        it out by a hair, to spill, a version stale, into the next merge). A straggler
        or a dead island, expected later or earlier, is not waited for.
        """
        pending = self._rounds[fragment]
        if not pending:
            return None
        period = self.sync.inner_steps * stats.step_time_s
        reach = min(p.arrival_time for p in pending.values()) + PERIOD_REACH * period
        expected = [at + self.sync.inner_steps * stats.island_step_s.get(island,
                                                                          stats.step_time_s)
                    for island, at in self.arrived[fragment].items() if island not in pending]
        return max((at + EXPECTED_SLACK * period for at in expected if at <= reach),
                   default=None)

    def roll_back(self, fragment: int, params: dict[str, torch.Tensor],
                  momentum: dict[str, torch.Tensor], now: float) -> list[str]:
        """Put a fragment back to a checkpoint, as a new version.

        Versions never go backwards: the checkpoint's content is published as the
        next version, so every island sees it as newer than what it holds. The
        open round is thrown away; returns the islands whose updates were in it.
        """
        discarded = list(self._rounds[fragment])
        for island, pending in self._rounds[fragment].items():
            self.settle(fragment, island, pending.contribution.seq)
        self._rounds[fragment] = {}
        self.sums[fragment] = self._round_sum()
        self.globals[fragment] = {n: t.clone() for n, t in params.items()}
        self.optimizers[fragment].load_state_dict(momentum)
        self._versions[fragment] += 1
        self.published_at[fragment] = now
        self.history[fragment].clear()  # a difference across a rollback means nothing
        return discarded

    @torch.no_grad()
    def merge(self, fragment: int, now: float) -> MergeResult | None:
        """Merge the round of `fragment` and publish the next version; None if the round
        is empty."""
        version = self._versions[fragment]
        round_sum = self.sums[fragment]
        gates = {i: p.gate for i, p in self._rounds[fragment].items()}
        self._rounds[fragment] = {}
        self.sums[fragment] = self._round_sum()
        updates = [round_sum.contributions[i] for i in sorted(round_sum.contributions)]
        for u in updates:
            self.settle(fragment, u.island, u.seq)
        if not updates:
            return None
        outer_grad, weights = round_sum.merged()
        # A merge of K of M islands carries part of a round's work; it moves the
        # global and its momentum by that share, so merging more often is not
        # the same as taking bigger steps.
        # At most 1: a round that carries more than a whole round's tokens (islands that
        # kept sending increments while syncd was away, then merged at once) already
        # holds all that progress in its merged update; scaling it up again would step
        # that many times too far, and the run diverges.
        # With a staleness weighting, stale tokens count for their age's share of a step.
        share = min(sum(u.tokens * gates.get(u.island, 1.0) for u in updates)
                    / self.round_tokens, 1.0)
        old = self.globals[fragment]
        new = self.optimizers[fragment].step(old, outer_grad, share, consume_grad=True)
        codec = self.sync.downlink_compression
        if codec == "none":
            payload = new
        else:
            payload = codecs.encode({n: new[n] - old[n] for n in new}, codec)
            diff = codecs.decode(payload, codec, self.shapes[fragment])
            new = {n: old[n] + diff[n] for n in old}
        self.globals[fragment] = new
        self._versions[fragment] = version + 1
        self.published_at[fragment] = now
        if codec != "none":
            self.history[fragment].append(Published(version + 1, now, codec, payload))
        return MergeResult(fragment, version + 1, now, weights, sum(u.tokens for u in updates),
                           {u.island: u.inner_steps for u in updates},
                           {u.island: u.seq for u in updates},
                           {u.island: version - u.base_version for u in updates})

    def published_since(self, fragment: int, held_version: int) -> list[Published]:
        """What an island holding `held_version` pulls to reach the newest version.

        The newest full fragment for codec "none" or for an island too far behind
        for the kept differences; otherwise the differences in order.
        """
        newest = self._versions[fragment]
        if held_version >= newest:
            return []
        history = self.history[fragment]
        if not history or history[0].version > held_version + 1:
            return [Published(newest, self.published_at[fragment], "none",
                              self.globals[fragment])]
        return [p for p in history if p.version > held_version]

    def global_params(self) -> dict[str, torch.Tensor]:
        return {n: t for g in self.globals for n, t in g.items()}


def history_length(sync: SyncConfig) -> int:
    """Published differences worth keeping per fragment: as many as an island may lag
    behind (max_staleness, at least one); none when the downlink sends whole fragments."""
    return 0 if sync.downlink_compression == "none" else max(sync.max_staleness, 1)


def apply_published(held: dict[str, torch.Tensor], published: list[Published],
                    shapes: dict[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    """The newest global fragment from what an island pulled (its tensors may be the
    pulled payload's own: read them, do not write them)."""
    out = held
    for p in published:
        if p.codec == "none":
            out = dict(p.payload)  # not copied: Island.mix_global takes its own copy
        else:
            # a lossy codec's decode is a tensor of its own: the sum goes into it, the
            # same sum to the bit as syncd's old + diff
            diff = codecs.decode(p.payload, p.codec, shapes)
            out = {n: diff[n].add_(out[n]) for n in out}
    return out
