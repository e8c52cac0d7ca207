"""Fragments: the parameters cut into P parts that are synced at staggered times.

Streaming DiLoCo (arXiv 2501.18512) syncs a different fragment of the model at
different inner steps, so the bytes on the wide-area link are spread over the
outer period instead of arriving all at once (peak bandwidth / P). Fragments
here are made of whole tensors, packed greedily so that they are of similar
size, and named by the modules they hold ("blocks.0-1+ln_f"), which reads well
in logs and in the control room. Any module tree is cut the same way, by its tensors
in the model's order (a transformers model's too, diloco/hf.py): each tensor is in
exactly one fragment, and a tied weight, which the model's state dict holds once, too.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from diloco.config import RunConfig, tokenizer_vocab
from diloco.shapes import tensor_sizes


@dataclass(frozen=True)
class Fragment:
    index: int
    name: str
    tensor_names: tuple[str, ...]
    numel: int


def partition(shapes: dict[str, int], num_fragments: int) -> list[Fragment]:
    """Pack whole tensors into `num_fragments` fragments of similar size.

    Greedy bin-packing: the largest tensor first, each into the fragment that is
    currently the smallest. Ties go to the lower fragment index, so the result
    depends only on the shapes.

    Args:
        shapes: tensor name -> number of elements, in model order.
        num_fragments: P, at least 1 and at most the number of tensors.
    """
    if num_fragments < 1:
        raise ValueError(f"num_fragments must be at least 1, got {num_fragments}")
    if num_fragments > len(shapes):
        raise ValueError(f"num_fragments must be at most the number of tensors "
                         f"({len(shapes)}), got {num_fragments}")
    order = {name: i for i, name in enumerate(shapes)}
    bins: list[list[str]] = [[] for _ in range(num_fragments)]
    sizes = [0] * num_fragments
    for name in sorted(shapes, key=lambda n: (-shapes[n], order[n])):
        p = min(range(num_fragments), key=lambda i: (sizes[i], i))
        bins[p].append(name)
        sizes[p] += shapes[name]
    fragments = []
    for p, names in enumerate(bins):
        names = sorted(names, key=order.__getitem__)
        fragments.append(Fragment(p, module_label(names), tuple(names), sizes[p]))
    return fragments



def run_fragments(config: RunConfig) -> list[Fragment]:
    """The partition of a run's model that syncd and its islands use, from the model's
    shapes (computed, not built)."""
    return partition(tensor_sizes(config.model, tokenizer_vocab(config)), config.sync.fragments)

def module_label(tensor_names: Iterable[str]) -> str:
    """A short readable name for a set of tensors: "blocks.0-2+lm_head", a repeated
    block by its list's path and numbers, any other tensor by its module's path (a
    transformers model's "lm.model.layers.0-3+lm.model.norm")."""
    indexed: dict[str, list[int]] = {}
    plain: list[str] = []
    for name in tensor_names:
        match = re.match(r"^(.+?)\.(\d+)\.", name)
        if match:
            indexed.setdefault(match.group(1), []).append(int(match.group(2)))
        else:
            module = name.rpartition(".")[0] or name
            if module not in plain:
                plain.append(module)
    parts = []
    for prefix, numbers in indexed.items():
        parts.append(f"{prefix}.{_ranges(sorted(set(numbers)))}")
    return "+".join(parts + plain)


def _ranges(numbers: list[int]) -> str:
    out, start = [], numbers[0]
    for prev, cur in zip(numbers, [*numbers[1:], None], strict=True):
        if cur != prev + 1:
            out.append(str(start) if start == prev else f"{start}-{prev}")
            start = cur
    return ",".join(out)


def sync_offset(fragment: int, inner_steps: int, num_fragments: int) -> int:
    """The inner step (mod H) after which fragment p is due: floor(H*(p+1)/P) mod H."""
    return (inner_steps * (fragment + 1) // num_fragments) % inner_steps


def due_fragments(step: int, inner_steps: int, num_fragments: int) -> list[int]:
    """Fragments due for sync after inner step `step` (counted from 1)."""
    if step < 1:
        raise ValueError(f"inner steps are counted from 1, got {step}")
    return [p for p in range(num_fragments)
            if step % inner_steps == sync_offset(p, inner_steps, num_fragments)]
