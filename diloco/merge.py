"""Merging updates into a fragment and the outer optimizer.

An update is anchor - theta: how far an island moved a fragment away
from the global version it started from. DiLoCo (arXiv 2311.08105) averages
them and applies SGD with Nesterov momentum to the global parameters. Decoupled
DiLoCo (arXiv 2604.21428) weights each update by the tokens behind it times
their quality proxy, tokens per step, so an island that trained a partial
window or a smaller batch counts for less, and optionally averages
non-embedding tensors radially and directionally (RDA), which keeps the norm
of the merged update from shrinking when islands disagree in direction.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from diloco.codecs import Encoded
from diloco.config import WEIGHTINGS


@dataclass(frozen=True)
class Update:
    """One island's update for one fragment: its tensors decoded (merge_updates
    takes only these), or as they came over the wire (diloco.codecs.Encoded, which a
    diloco.fold.RoundSum decodes as it folds them in)."""

    island: str
    base_version: int
    tokens: int
    inner_steps: int
    delta: dict[str, torch.Tensor | Encoded]
    seq: int = 0  # the island's inner step when it sent
    # The norm of each delta tensor where whoever checked the update measured it
    # (syncd/ingest.py): a fold reuses it instead of another pass over the tensor.
    norms: dict[str, float] | None = None


def update_weight(tokens: int, inner_steps: int, weighting: str) -> float:
    """w = tokens * tokens/steps for "tokens"; 1 for "uniform"."""
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting must be one of {', '.join(WEIGHTINGS)}, got {weighting!r}")
    if weighting == "uniform":
        return 1.0
    if tokens < 0 or inner_steps < 0:
        raise ValueError(f"tokens and inner_steps must not be negative, got {tokens}, "
                         f"{inner_steps}")
    return float(tokens) * tokens / inner_steps if inner_steps else 0.0


def merge_weights(updates: list[Update], weighting: str) -> dict[str, float]:
    """Normalized weights per island; they sum to 1."""
    raw = {u.island: update_weight(u.tokens, u.inner_steps, weighting) for u in updates}
    total = sum(raw.values())
    if total <= 0:
        raise ValueError("cannot merge updates whose weights are all zero")
    return {island: w / total for island, w in raw.items()}


def merge_updates(updates: list[Update], weighting: str, rda: bool = False,
                  embedding_names: tuple[str, ...] = ()) -> tuple[dict[str, torch.Tensor],
                                                                 dict[str, float]]:
    """The merged update of a fragment and the weights used.

    Updates are summed in island order, so the result does not depend on the
    order in which they arrived.

    Args:
        updates: at least one, all for the same fragment (same tensor names).
        weighting: "tokens" or "uniform".
        rda: radial-directional averaging for tensors not in `embedding_names`.
        embedding_names: tensors that are always averaged plainly.
    """
    if not updates:
        raise ValueError("merge_updates needs at least one update")
    updates = sorted(updates, key=lambda u: u.island)
    weights = merge_weights(updates, weighting)
    names = list(updates[0].delta)
    for u in updates[1:]:
        if list(u.delta) != names:
            raise ValueError(f"update from {u.island} holds tensors {list(u.delta)}, "
                             f"expected {names}")
    merged = {}
    for name in names:
        vs = [u.delta[name] for u in updates]
        ws = [weights[u.island] for u in updates]
        if rda and name not in embedding_names:
            merged[name] = radial_directional_average(vs, ws)
        else:
            merged[name] = _weighted_sum(vs, ws)
    return merged, weights


def radial_directional_average(vectors: list[torch.Tensor], weights: list[float]
                               ) -> torch.Tensor:
    """(sum w*|v| / sum w) * unit(sum w * unit(v)): the mean norm along the mean direction."""
    total = sum(weights)
    norms = [float(v.norm()) for v in vectors]
    radius = sum(w * n for w, n in zip(weights, norms, strict=True)) / total
    # sum w * unit(v) is sum (w / |v|) * v: one pass per vector, no unit copies.
    direction = torch.zeros_like(vectors[0])
    for v, w, n in zip(vectors, weights, norms, strict=True):
        if n > 0:
            direction.add_(v, alpha=w / n)
    length = float(direction.norm())
    if length == 0:
        return direction
    return direction.mul_(radius / length)


def _weighted_sum(vectors: list[torch.Tensor], weights: list[float]) -> torch.Tensor:
    out = torch.zeros_like(vectors[0])
    for v, w in zip(vectors, weights, strict=True):
        out.add_(v, alpha=w)
    return out


class OuterOptimizer:
    """SGD with Nesterov momentum over one fragment's global parameters.

    The same update as torch.optim.SGD(nesterov=True, dampening=0): buf = m*buf + g,
    step = g + m*buf, theta -= lr * step; with momentum 0 it is plain SGD.

    Args:
        lr: outer learning rate (DiLoCo uses 0.7).
        momentum: Nesterov momentum (0.9), 0 for plain SGD.
    """

    def __init__(self, lr: float, momentum: float):
        if lr <= 0:
            raise ValueError(f"outer lr must be positive, got {lr}")
        if not 0 <= momentum < 1:
            raise ValueError(f"outer momentum must be in [0, 1), got {momentum}")
        self.lr = lr
        self.momentum = momentum
        self.buffers: dict[str, torch.Tensor] = {}

    def step(self, params: dict[str, torch.Tensor], outer_grad: dict[str, torch.Tensor],
             share: float = 1.0, consume_grad: bool = False) -> dict[str, torch.Tensor]:
        """New parameters after an outer step; `params` is left unchanged.

        Args:
            params: the fragment's global parameters.
            outer_grad: the merged update.
            share: the part of a whole round this step stands for (tokens merged /
                tokens all islands train in H steps). A step of share s scales the
                gradient and the momentum term by s and decays the buffer by m**s,
                so 1/s steps of share s move about as far as one step of share 1.
            consume_grad: the caller gives `outer_grad` up: its tensors are worked on in
                place and become the new parameters, so the step makes no tensor of
                the fragment's size (a round's sums, diloco/fold.py).
        """
        if share <= 0:
            raise ValueError(f"share must be positive, got {share}")
        out = {}
        for name, p in params.items():
            # One tensor per parameter, worked on in place and returned: at real sizes every
            # fresh tensor of a fragment's size costs more to fault in than to fill.
            if consume_grad:
                g = outer_grad[name].mul_(share) if share != 1.0 else outer_grad[name]
            else:
                g = outer_grad[name] * share if share != 1.0 else outer_grad[name].clone()
            if self.momentum:
                buf = self.buffers.get(name)
                decay = self.momentum ** share
                # g + decay * buf into buf: one pass, where mul_ then add_ made two
                buf = g.clone() if buf is None else torch.add(g, buf, alpha=decay, out=buf)
                self.buffers[name] = buf
                g.add_(buf, alpha=self.momentum * share)
            out[name] = torch.add(p, g, alpha=-self.lr, out=g)  # p - lr * g, one pass
        return out

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {f"momentum.{k}": v for k, v in self.buffers.items()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.buffers = {k.removeprefix("momentum."): v.clone() for k, v in state.items()}
