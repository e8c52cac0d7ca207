"""Folding a round's updates in as they arrive: its running sums.

diloco.merge.merge_updates takes a round's whole list of updates, so whoever calls
it holds every island's decoded delta until the round closes: memory that grows
with the number of islands. A `RoundSum` takes the updates one by one, after their
checks, and keeps per tensor only the sums that merge_updates' formulas need, so
the caller can drop each delta (and its message) as soon as it is folded in:

- plain weighting: sum w*v and sum w; merged = sum w*v / sum w, which is
  merge.py's _weighted_sum with normalised weights;
- RDA (radial_directional_average): sum (w/|v|)*v, sum w*|v| and sum w; merged =
  unit(sum (w/|v|)*v) * (sum w*|v| / sum w). Normalising the weights scales the
  direction, which unit() undoes, and both sums of the radius alike, so the
  weights need not be known in full until the round closes.

An update's tensors may be the tensors of its message as they came over the wire
(diloco.codecs.Encoded, as syncd checks them): they are decoded a chunk at a time
into the sums, and the float32 delta is never made.

Per island it keeps scalars only (a `Contribution`: tokens, steps, base version,
newest seq, the weight and, for RDA, the norm of each tensor), never a tensor.

Increments. An island may send a second update into a round that is still open (a
round that waits for its quorum for more than the island's H steps); the second is
an increment on top of the first, and the two add up. merge_updates weights an
island's summed increments by the island's summed tokens and takes the RDA norm of
the summed vector, which is not linear: folding it exactly needs the island's
earlier increments as a tensor when a later one comes (the cross terms w2*v1 of
(w1 + w2) * (v1 + v2), and v1.v2 in |v1 + v2|), and keeping that tensor for every
island that might repeat is keeping M tensors again. So an island's weight and
its norms are fixed by its first increment in the round, and its later increments
add to its vector at that weight: its contribution is w1 * (v1 + v2) (plain) and
(w1 / |v1|) * (v1 + v2) with radius w1 * |v1| (RDA). A round without repeats, and a
round of plain uniform weighting with repeats (w = 1: linear), merge exactly as
merge_updates does; a round where an island repeats under token weighting or RDA
weighs that island by its first increment's tokens and norm (tests/diloco/
test_fold.py shows both). The summing is in arrival order, not island order: the
same result to float tolerance, not bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from diloco.codecs import Encoded
from diloco.config import WEIGHTINGS
from diloco.merge import Update, update_weight


@dataclass(frozen=True)
class Contribution:
    """What a round holds of one island: the scalars of its increments, added up.

    Attributes:
        island: the island's name.
        base_version: the oldest base version of its increments.
        tokens, inner_steps: summed over its increments.
        seq: its newest increment's seq.
        increments: how many it sent into the round.
        weight: its raw weight, fixed by its first increment (update_weight).
        norms: RDA only: the norm of each tensor of its first increment (a tensor
            whose first increment is all zeros has no direction, so its later
            increments add nothing to it: the edge merge_updates avoids by
            taking the summed vector's norm).
    """

    island: str
    base_version: int
    tokens: int
    inner_steps: int
    seq: int
    increments: int
    weight: float
    norms: dict[str, float] = field(default_factory=dict)


class RoundSum:
    """The running sums of one fragment's open round.

    Args:
        weighting: "tokens" or "uniform".
        rda: radial-directional averaging for tensors not in `embedding_names`.
        embedding_names: tensors that are always averaged plainly.
    """

    def __init__(self, weighting: str, rda: bool = False,
                 embedding_names: tuple[str, ...] = ()):
        if weighting not in WEIGHTINGS:
            raise ValueError(f"weighting must be one of {', '.join(WEIGHTINGS)}, "
                             f"got {weighting!r}")
        self.weighting = weighting
        self.rda = rda
        self.embedding_names = embedding_names
        self.contributions: dict[str, Contribution] = {}
        # name -> sum w*v (plain) or sum (w/|v|)*v (RDA); name -> sum w*|v| (RDA)
        self.sums: dict[str, torch.Tensor] = {}
        self.radii: dict[str, float] = {}

    def _radial(self, name: str) -> bool:
        return self.rda and name not in self.embedding_names

    @torch.no_grad()
    def add(self, update: Update, gate: float = 1.0) -> Contribution:
        """Fold one checked update in; returns its island's contribution so far. `gate`
        scales its weight (diloco.staleness.age_gate; an island's first increment's).

        Raises:
            ValueError: its tensors are not the round's.
        """
        names = list(self.sums) or list(update.delta)
        if list(update.delta) != names:
            raise ValueError(f"update from {update.island} holds tensors {list(update.delta)}, "
                             f"expected {names}")
        prev = self.contributions.get(update.island)
        if prev is None:
            weight = update_weight(update.tokens, update.inner_steps, self.weighting) * gate
            norms = ({n: _norm(update, n) for n in update.delta if self._radial(n)}
                     if self.rda else {})
            for name, n in norms.items():
                self.radii[name] = self.radii.get(name, 0.0) + weight * n
            contribution = Contribution(update.island, update.base_version, update.tokens,
                                        update.inner_steps, update.seq, 1, weight, norms)
        else:
            weight, norms = prev.weight, prev.norms
            contribution = Contribution(update.island,
                                        min(prev.base_version, update.base_version),
                                        prev.tokens + update.tokens,
                                        prev.inner_steps + update.inner_steps,
                                        max(prev.seq, update.seq), prev.increments + 1,
                                        weight, norms)
        for name, v in update.delta.items():
            if self._radial(name):
                n = norms[name]
                alpha = weight / n if n > 0 else 0.0
            else:
                alpha = weight
            total = self.sums.get(name)
            if total is None:  # a new tensor: the update's stays its own
                self.sums[name] = v.scaled(alpha) if isinstance(v, Encoded) else v.mul(alpha)
            elif isinstance(v, Encoded):
                v.add_to(total, alpha)
            else:
                total.add_(v, alpha=alpha)
        self.contributions[update.island] = contribution
        return contribution

    def weights(self) -> dict[str, float]:
        """Normalised weights per island (they sum to 1), in island order."""
        total = sum(c.weight for c in self.contributions.values())
        if total <= 0:
            raise ValueError("cannot merge updates whose weights are all zero")
        return {island: self.contributions[island].weight / total
                for island in sorted(self.contributions)}

    @torch.no_grad()
    def merged(self) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        """The merged update and the weights used, as merge_updates gives them.
        It ends the round: the sums become the result (no copy).

        Raises:
            ValueError: nothing was folded in, or every weight is zero.
        """
        if not self.contributions:
            raise ValueError("a round sum needs at least one update to merge")
        weights = self.weights()
        total = sum(c.weight for c in self.contributions.values())
        merged = {}
        for name, s in self.sums.items():
            if self._radial(name):
                length = float(s.norm())
                merged[name] = s if length == 0 else s.mul_(self.radii[name] / total / length)
            else:
                merged[name] = s.div_(total)
        self.sums, self.radii = {}, {}
        return merged, weights


def _norm(update: Update, name: str) -> float:
    """The norm of one of the update's tensors: the one its checks measured, if any."""
    if update.norms is not None and name in update.norms:
        return update.norms[name]
    v = update.delta[name]
    if isinstance(v, Encoded):
        norm = v.norm()
        if norm is None:
            raise ValueError(f"update from {update.island}: tensor {name} is not finite")
        return norm
    return float(v.norm())
