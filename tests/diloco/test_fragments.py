from collections import Counter
from itertools import pairwise

import pytest

from diloco.fragments import due_fragments, module_label, partition, sync_offset
from diloco.model import GPT, GPTConfig


def gpt_shapes(n_layer: int = 4, n_embd: int = 64) -> dict[str, int]:
    model = GPT(GPTConfig(n_layer=n_layer, n_embd=n_embd, n_head=4, block_size=64))
    return {name: t.numel() for name, t in model.state_dict().items()}


def test_every_tensor_is_in_exactly_one_fragment_and_whole():
    shapes = gpt_shapes()

    fragments = partition(shapes, 4)

    names = [n for f in fragments for n in f.tensor_names]
    assert Counter(names) == Counter(list(shapes))
    assert [f.index for f in fragments] == [0, 1, 2, 3]
    for f in fragments:
        assert f.numel == sum(shapes[n] for n in f.tensor_names)


def test_the_fragments_of_the_gpt_are_of_similar_size():
    shapes = gpt_shapes(n_layer=4, n_embd=64)
    total = sum(shapes.values())

    sizes = [f.numel for f in partition(shapes, 4)]

    assert max(sizes) <= 1.25 * total / 4
    assert min(sizes) >= 0.75 * total / 4


def test_the_tensors_of_a_fragment_keep_model_order():
    shapes = gpt_shapes()
    order = list(shapes)

    for f in partition(shapes, 3):
        assert list(f.tensor_names) == sorted(f.tensor_names, key=order.index)


def test_the_partition_depends_only_on_the_shapes():
    shapes = gpt_shapes(n_layer=2)

    assert partition(shapes, 3) == partition(dict(shapes), 3)


def test_one_fragment_holds_the_whole_model():
    shapes = gpt_shapes(n_layer=2)

    [fragment] = partition(shapes, 1)

    assert fragment.tensor_names == tuple(shapes)
    assert fragment.name == "blocks.0-1+tok_emb+pos_emb+ln_f+lm_head"


def test_a_fragment_is_named_by_the_modules_it_holds():
    names = ["blocks.0.attn.c_attn.weight", "blocks.1.mlp.c_fc.weight", "ln_f.weight",
             "ln_f.bias"]

    assert module_label(names) == "blocks.0-1+ln_f"
    assert module_label(["blocks.0.x", "blocks.1.x", "blocks.3.x", "lm_head.weight"]) \
        == "blocks.0-1,3+lm_head"
    assert module_label(["tok_emb.weight"]) == "tok_emb"


def test_every_fragment_name_comes_from_its_tensors():
    for f in partition(gpt_shapes(), 4):
        assert f.name == module_label(f.tensor_names)
        assert f.name


@pytest.mark.parametrize(("count", "message"), [
    (0, "num_fragments must be at least 1, got 0"),
    (4, r"num_fragments must be at most the number of tensors \(3\), got 4"),
])
def test_it_rejects_a_fragment_count_out_of_range(count, message):
    with pytest.raises(ValueError, match=message):
        partition({"a.weight": 10, "b.weight": 10, "c.weight": 10}, count)


def test_inner_steps_are_counted_from_one():
    with pytest.raises(ValueError, match="counted from 1, got 0"):
        due_fragments(0, 8, 4)


def test_fragment_p_is_due_at_its_offset_floor_h_times_p_plus_one_over_p():
    # H = 8, P = 4: offsets 2, 4, 6 and 8 mod 8 = 0.
    assert [sync_offset(p, 8, 4) for p in range(4)] == [2, 4, 6, 0]
    assert due_fragments(2, 8, 4) == [0]
    assert due_fragments(6, 8, 4) == [2]
    assert due_fragments(8, 8, 4) == [3]
    assert due_fragments(10, 8, 4) == [0]
    assert due_fragments(3, 8, 4) == []


@pytest.mark.parametrize(("inner_steps", "num_fragments"), [(8, 4), (10, 3), (7, 7), (5, 1),
                                                            (50, 4)])
def test_every_fragment_is_due_once_per_h_steps_spread_evenly(inner_steps, num_fragments):
    h = inner_steps
    due = {t: due_fragments(t, h, num_fragments) for t in range(1, 3 * h + 1)}

    for start in (1, h + 1, 2 * h + 1):
        window = [p for t in range(start, start + h) for p in due[t]]
        assert sorted(window) == list(range(num_fragments))
    steps = sorted(t for t, ps in due.items() if ps)
    gaps = {b - a for a, b in pairwise(steps)}
    assert max(gaps) - min(gaps) <= 1
    assert all(len(ps) <= 1 for ps in due.values())
