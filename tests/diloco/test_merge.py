import itertools

import pytest
import torch

from diloco.merge import (
    OuterOptimizer,
    Update,
    merge_updates,
    merge_weights,
    radial_directional_average,
    update_weight,
)


def update(island: str, tokens: int = 1024, steps: int = 8, **delta: torch.Tensor) -> Update:
    return Update(island, base_version=0, tokens=tokens, inner_steps=steps,
                  delta=delta or {"w": torch.ones(3)})


def test_the_token_weight_is_tokens_times_tokens_per_step():
    assert update_weight(1000, 10, "tokens") == 1000 * 100
    assert update_weight(0, 0, "tokens") == 0.0


def test_a_smaller_batch_weighs_less_than_its_share_of_tokens():
    # Same number of steps, half the batch: half the tokens and half the quality.
    full = update_weight(8 * 64 * 10, 10, "tokens")
    half_batch = update_weight(4 * 64 * 10, 10, "tokens")

    assert half_batch / full == pytest.approx(0.25)


def test_a_partial_window_weighs_less_than_a_full_one():
    full = update_weight(8 * 64 * 10, 10, "tokens")
    partial = update_weight(8 * 64 * 5, 5, "tokens")

    assert partial / full == pytest.approx(0.5)


def test_uniform_weighting_ignores_tokens():
    assert update_weight(10, 1, "uniform") == update_weight(10**6, 50, "uniform") == 1.0
    weights = merge_weights([update("a", tokens=10, steps=1), update("b", tokens=10**6)],
                            "uniform")
    assert weights == {"a": 0.5, "b": 0.5}


def test_merge_weights_are_normalized_to_sum_to_one():
    weights = merge_weights([update("a", 100, 1), update("b", 300, 3), update("c", 200, 1)],
                            "tokens")

    assert sum(weights.values()) == pytest.approx(1.0)
    # raw weights 100*100, 300*100, 200*200
    assert weights == pytest.approx({"a": 0.125, "b": 0.375, "c": 0.5})


def test_token_weights_differ_from_uniform_when_batches_differ():
    updates = [update("a", tokens=8 * 64 * 10, steps=10), update("b", tokens=2 * 64 * 10, steps=10)]

    assert merge_weights(updates, "tokens") != merge_weights(updates, "uniform")
    assert merge_weights(updates, "tokens")["a"] > 0.9


def test_it_refuses_to_merge_when_every_weight_is_zero():
    with pytest.raises(ValueError, match="weights are all zero"):
        merge_weights([update("a", tokens=0, steps=0)], "tokens")


def test_it_rejects_an_unknown_weighting_and_negative_counts():
    with pytest.raises(ValueError, match="weighting must be one of tokens, uniform, got 'loss'"):
        update_weight(1, 1, "loss")
    with pytest.raises(ValueError, match="must not be negative"):
        update_weight(-1, 1, "tokens")


def test_rda_takes_the_weighted_mean_norm_along_the_weighted_mean_direction():
    a = torch.tensor([3.0, 0.0])  # norm 3
    b = torch.tensor([0.0, 1.0])  # norm 1

    out = radial_directional_average([a, b], [0.75, 0.25])

    mean_norm = 0.75 * 3 + 0.25 * 1
    direction = torch.tensor([0.75, 0.25]) / torch.tensor([0.75, 0.25]).norm()
    assert out.norm().item() == pytest.approx(mean_norm)
    assert torch.allclose(out, direction * mean_norm)


def test_rda_keeps_the_norm_that_plain_averaging_loses():
    a, b = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])

    assert radial_directional_average([a, b], [0.5, 0.5]).norm().item() == pytest.approx(1.0)
    assert ((a + b) / 2).norm().item() == pytest.approx(2**-0.5)


def test_rda_of_parallel_vectors_of_equal_norm_is_the_plain_average():
    v = torch.randn(4, 5, generator=torch.Generator().manual_seed(0))

    out = radial_directional_average([v, v.clone(), v.clone()], [0.2, 0.3, 0.5])

    assert torch.allclose(out, v, atol=1e-6)


def test_rda_of_opposite_vectors_is_zero():
    v = torch.ones(3)

    assert torch.equal(radial_directional_average([v, -v], [1.0, 1.0]), torch.zeros(3))


def test_merge_averages_embeddings_plainly_and_the_rest_radially():
    a = update("a", w=torch.tensor([1.0, 0.0]), emb=torch.tensor([1.0, 0.0]))
    b = update("b", w=torch.tensor([0.0, 1.0]), emb=torch.tensor([0.0, 1.0]))

    merged, weights = merge_updates([a, b], "uniform", rda=True, embedding_names=("emb",))

    assert weights == {"a": 0.5, "b": 0.5}
    assert torch.allclose(merged["emb"], torch.tensor([0.5, 0.5]))
    assert merged["w"].norm().item() == pytest.approx(1.0)


def test_merge_without_rda_is_the_weighted_average():
    a = update("a", tokens=300, steps=1, w=torch.tensor([1.0, 0.0]))
    b = update("b", tokens=100, steps=1, w=torch.tensor([0.0, 1.0]))

    merged, _ = merge_updates([a, b], "tokens")

    assert torch.allclose(merged["w"], torch.tensor([0.9, 0.1]))


@pytest.mark.parametrize("rda", [False, True])
def test_the_merged_result_does_not_depend_on_the_order_of_updates(rda):
    g = torch.Generator().manual_seed(1)
    updates = [update(name, tokens=t, steps=s, w=torch.randn(50, generator=g),
                      emb=torch.randn(7, 3, generator=g))
               for name, t, s in (("c", 300, 3), ("a", 512, 4), ("b", 128, 2))]
    first, _ = merge_updates(updates, "tokens", rda=rda, embedding_names=("emb",))

    for order in itertools.permutations(updates):
        merged, _ = merge_updates(list(order), "tokens", rda=rda, embedding_names=("emb",))
        assert all(torch.equal(merged[n], first[n]) for n in first)


def test_merge_rejects_updates_of_different_tensors():
    with pytest.raises(ValueError, match="update from b holds tensors"):
        merge_updates([update("a", w=torch.ones(2)), update("b", v=torch.ones(2))], "uniform")
    with pytest.raises(ValueError, match="at least one update"):
        merge_updates([], "uniform")


def test_the_outer_optimizer_matches_torch_nesterov_sgd():
    g = torch.Generator().manual_seed(2)
    start = {"w": torch.randn(4, 3, generator=g), "b": torch.randn(3, generator=g)}
    grads = [{n: torch.randn(t.shape, generator=g) for n, t in start.items()} for _ in range(4)]
    reference = {n: torch.nn.Parameter(t.clone()) for n, t in start.items()}
    sgd = torch.optim.SGD(reference.values(), lr=0.7, momentum=0.9, nesterov=True)
    outer = OuterOptimizer(lr=0.7, momentum=0.9)
    params = {n: t.clone() for n, t in start.items()}

    for grad in grads:
        for n, p in reference.items():
            p.grad = grad[n].clone()
        sgd.step()
        params = outer.step(params, grad, share=1.0)

    for n, p in reference.items():
        assert torch.allclose(params[n], p.detach(), atol=1e-6)
    assert not torch.allclose(params["w"], start["w"])


def test_the_outer_optimizer_without_momentum_is_plain_sgd():
    outer = OuterOptimizer(lr=0.5, momentum=0.0)
    params = {"w": torch.tensor([1.0, 2.0])}

    for _ in range(3):
        params = outer.step(params, {"w": torch.tensor([1.0, -1.0])})

    assert torch.allclose(params["w"], torch.tensor([1.0 - 1.5, 2.0 + 1.5]))
    assert outer.buffers == {}


def test_an_outer_step_leaves_its_input_parameters_unchanged():
    params = {"w": torch.ones(2)}

    OuterOptimizer(lr=1.0, momentum=0.9).step(params, {"w": torch.ones(2)})

    assert torch.equal(params["w"], torch.ones(2))


def test_a_partial_share_scales_the_step_and_the_momentum_decay():
    outer = OuterOptimizer(lr=1.0, momentum=0.9)
    params = {"w": torch.zeros(1)}
    grad = {"w": torch.ones(1)}

    params = outer.step(params, grad, share=0.5)  # buf = 0.5, step = 0.5 + 0.9*0.5*0.5
    params = outer.step(params, grad, share=0.5)  # buf = 0.9**0.5 * 0.5 + 0.5

    first = 0.5 + 0.9 * 0.5 * 0.5
    buf = 0.9**0.5 * 0.5 + 0.5
    second = 0.5 + 0.9 * 0.5 * buf
    assert params["w"].item() == pytest.approx(-(first + second))


def test_the_outer_optimizer_state_survives_a_round_trip():
    outer = OuterOptimizer(lr=0.7, momentum=0.9)
    outer.step({"w": torch.zeros(2)}, {"w": torch.ones(2)})
    restored = OuterOptimizer(lr=0.7, momentum=0.9)

    restored.load_state_dict(outer.state_dict())

    a = outer.step({"w": torch.zeros(2)}, {"w": torch.ones(2)})
    b = restored.step({"w": torch.zeros(2)}, {"w": torch.ones(2)})
    assert torch.equal(a["w"], b["w"])


@pytest.mark.parametrize(("lr", "momentum", "message"), [
    (0.0, 0.9, "outer lr must be positive, got 0.0"),
    (0.7, 1.0, r"outer momentum must be in \[0, 1\), got 1.0"),
])
def test_it_rejects_bad_outer_settings(lr, momentum, message):
    with pytest.raises(ValueError, match=message):
        OuterOptimizer(lr, momentum)


@pytest.mark.parametrize("share", [1.0, 0.5])
def test_a_step_that_consumes_its_gradient_makes_the_same_parameters_in_its_tensors(share):
    g = torch.Generator().manual_seed(4)
    params = {"w": torch.randn(5, generator=g)}
    grads = [{"w": torch.randn(5, generator=g)} for _ in range(3)]
    kept, consumed = OuterOptimizer(0.7, 0.9), OuterOptimizer(0.7, 0.9)
    a, b = dict(params), dict(params)

    for grad in grads:
        a = kept.step(a, grad, share)
        spent = {"w": grad["w"].clone()}
        b = consumed.step(b, spent, share, consume_grad=True)
        assert b["w"] is spent["w"]

    torch.testing.assert_close(a["w"], b["w"])
    assert not torch.equal(params["w"], b["w"])
