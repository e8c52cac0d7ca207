import threading
from dataclasses import replace

import pytest
import torch

from diloco import codecs
from diloco.data import load_corpus
from diloco.fragments import partition
from diloco.island import Island, initial_model, inner_lr
from diloco.synchronizer import Published
from syncd.environment import data_dir


@pytest.fixture
def island_of(make_config):
    """An island of a tiny two-island run with two fragments."""

    def make(alpha: float = 0.0, index: int = 0) -> Island:
        config = make_config(sync={"fragments": 2, "alpha": alpha},
                             optim={"inner_lr": 1e-2, "warmup_steps": 0})
        init = initial_model(config).state_dict()
        fragments = partition({n: t.numel() for n, t in init.items()}, 2)
        corpus = load_corpus(config.data.path, config.data.eval_fraction, data_dir())
        return Island(index, config, corpus, fragments, init)

    return make


def decoded(island: Island, p: int, codec: str) -> tuple[dict, dict[str, torch.Tensor]]:
    meta, payload = island.make_update(p, codec)
    shapes = {n: tuple(island.params[n].shape) for n in island.fragments[p].tensor_names}
    return meta, codecs.decode(payload, codec, shapes)


def train(island: Island, steps: int) -> None:
    for _ in range(steps):
        island.inner_step()


def snapshot(island: Island, p: int) -> dict[str, torch.Tensor]:
    return {n: t.clone() for n, t in island.fragment_params(p).items()}


def test_a_second_send_does_not_repeat_the_progress_of_the_first(island_of):
    island = island_of()
    anchor = snapshot(island, 0)
    train(island, 3)
    _, first = decoded(island, 0, "none")
    train(island, 2)

    _, second = decoded(island, 0, "none")

    for n, theta in island.fragment_params(0).items():
        assert torch.allclose(first[n] + second[n], anchor[n] - theta, atol=1e-6)
        assert not torch.allclose(second[n], anchor[n] - theta, atol=1e-6)


def test_what_a_lossy_codec_dropped_is_sent_again_with_the_next_increment(island_of):
    island = island_of()
    anchor = snapshot(island, 1)
    train(island, 3)
    _, first = decoded(island, 1, "int4")
    dropped = {n: anchor[n] - theta - first[n] for n, theta in island.fragment_params(1).items()}
    train(island, 1)
    increment = {n: anchor[n] - theta - first[n]
                 for n, theta in island.fragment_params(1).items()}

    _, second = decoded(island, 1, "int4")

    assert any(torch.count_nonzero(t) for t in dropped.values())
    for n, theta in island.fragment_params(1).items():
        # Only the last quantization's error is left: the first one's was resent.
        left_out = anchor[n] - theta - (first[n] + second[n])
        assert (left_out.abs() <= codecs.error_bound(increment[n], "int4")).all()


def test_an_update_carries_the_tokens_and_steps_since_the_last_send_of_its_fragment(island_of):
    island = island_of()
    train(island, 3)
    meta0, _ = island.make_update(0, "none")
    train(island, 2)

    meta0_again, _ = island.make_update(0, "none")
    meta1, _ = island.make_update(1, "none")

    per_step = island.island_config.batch_size * island.config.model.block_size
    assert meta0 == {"fragment": 0, "base_version": 0, "tokens": 3 * per_step,
                     "inner_steps": 3, "seq": 3}
    assert (meta0_again["tokens"], meta0_again["inner_steps"], meta0_again["seq"]) == \
        (2 * per_step, 2, 5)
    assert (meta1["tokens"], meta1["inner_steps"]) == (5 * per_step, 5)
    assert island.tokens == 5 * per_step


def test_mixing_with_alpha_0_and_no_steps_since_the_send_replaces_the_fragment(island_of):
    island = island_of(alpha=0.0)
    train(island, 2)
    island.make_update(0, "none")
    other = snapshot(island, 1)
    global_0 = {n: torch.randn_like(t) for n, t in island.fragment_params(0).items()}

    island.mix_global(0, global_0, version=3)

    for n, theta in island.fragment_params(0).items():
        # Equal up to float rounding: theta - (anchor - sent) is zero only in exact arithmetic.
        assert torch.allclose(theta, global_0[n], atol=1e-6)
        assert torch.equal(island.state[0].anchor[n], global_0[n])
    for n, theta in island.fragment_params(1).items():
        assert torch.equal(theta, other[n])
    assert island.state[0].version == 3
    assert island.state[0].sent is None


def test_mixing_keeps_the_progress_made_since_the_send_on_top_of_the_global(island_of):
    island = island_of(alpha=0.0)
    train(island, 2)
    island.make_update(0, "none")
    at_send = snapshot(island, 0)
    train(island, 2)
    now = snapshot(island, 0)
    global_0 = {n: t + 0.5 for n, t in at_send.items()}

    island.mix_global(0, global_0, version=1)

    for n, theta in island.fragment_params(0).items():
        assert torch.allclose(theta, global_0[n] + (now[n] - at_send[n]), atol=1e-6)
        assert not torch.allclose(now[n], at_send[n])


def test_mixing_with_alpha_interpolates_between_global_and_local(island_of):
    island = island_of(alpha=0.25)
    train(island, 2)
    island.make_update(0, "none")
    local = snapshot(island, 0)
    global_0 = {n: torch.zeros_like(t) for n, t in local.items()}

    island.mix_global(0, global_0, version=1)

    for n, theta in island.fragment_params(0).items():
        assert torch.allclose(theta, 0.25 * local[n], atol=1e-7)


@pytest.mark.parametrize("alpha", [0.0, 0.25, 0.75])
def test_a_mix_is_the_lerp_with_the_progress_since_the_send_to_the_bit_in_place(island_of,
                                                                                 alpha):
    island = island_of(alpha=alpha)
    train(island, 2)
    island.make_update(0, "int8")
    train(island, 1)
    s = island.state[0]
    global_0 = {n: t + 0.5 for n, t in s.anchor.items()}
    at_send = {n: s.anchor[n] - s.sent[n] for n in s.anchor}
    expected = {n: torch.lerp(global_0[n], at_send[n], alpha) + (theta - at_send[n])
                for n, theta in island.fragment_params(0).items()}
    storage = {n: (t.data_ptr(), island.params[n].data_ptr()) for n, t in s.anchor.items()}

    island.mix_global(0, global_0, version=1)

    for n, theta in island.fragment_params(0).items():
        assert torch.equal(theta, expected[n])
        assert torch.equal(s.anchor[n], global_0[n])
        assert (s.anchor[n].data_ptr(), theta.data_ptr()) == storage[n]  # no new tensor


def test_pulled_differences_are_mixed_in_on_top_of_the_anchor(island_of):
    island = island_of(alpha=0.0)
    anchor = {n: t.clone() for n, t in island.state[0].anchor.items()}
    diff = {n: torch.full_like(t, 0.25) for n, t in anchor.items()}
    pulled = [Published(1, 0.0, "int8", codecs.encode(diff, "int8")),
              Published(2, 0.0, "int8", codecs.encode(diff, "int8"))]

    island.mix_published(0, pulled, version=2)

    for n, theta in island.fragment_params(0).items():
        assert torch.allclose(theta, anchor[n] + 0.5, atol=1e-6)
        assert torch.equal(island.state[0].anchor[n], theta)
    assert island.state[0].version == 2


def test_a_pulled_whole_fragment_replaces_the_anchor(island_of):
    island = island_of(alpha=0.0)
    whole = {n: torch.randn_like(t) for n, t in island.state[0].anchor.items()}

    island.mix_published(0, [Published(4, 0.0, "none", whole)], version=4)

    for n, theta in island.fragment_params(0).items():
        assert torch.equal(theta, whole[n])


def test_an_update_right_after_a_mix_is_zero(island_of):
    island = island_of()
    train(island, 2)
    island.make_update(0, "none")
    island.mix_global(0, {n: t + 1.0 for n, t in snapshot(island, 0).items()}, version=1)

    meta, delta = decoded(island, 0, "none")

    assert meta["base_version"] == 1
    assert all(torch.count_nonzero(t) == 0 for t in delta.values())


def test_islands_of_one_run_start_from_the_same_parameters_but_see_different_data(island_of):
    a, b = island_of(index=0), island_of(index=1)

    for n, t in a.model.state_dict().items():
        assert torch.equal(t, b.model.state_dict()[n])
    assert a.inner_step() != b.inner_step()


def test_it_rejects_an_island_index_outside_the_run(island_of):
    with pytest.raises(ValueError, match="island index must be between 0 and 1, got 2"):
        island_of(index=2)


def test_the_inner_learning_rate_warms_up_linearly_then_stays_at_its_peak():
    assert [inner_lr(s, 1.0, 4) for s in (1, 2, 4, 5, 1000)] == [0.25, 0.5, 1.0, 1.0, 1.0]
    assert inner_lr(1, 0.3, 0) == 0.3


def test_the_initial_model_depends_only_on_the_seed(make_config):
    config = make_config()
    a = initial_model(config).state_dict()
    b = initial_model(config).state_dict()
    c = initial_model(replace(config, seed=1)).state_dict()

    assert all(torch.equal(a[n], b[n]) for n in a)
    assert not torch.equal(a["tok_emb.weight"], c["tok_emb.weight"])


def test_an_update_sent_on_the_encoding_thread_is_the_one_made_on_the_training_thread(
        island_of):
    made, sent = island_of(alpha=0.5), island_of(alpha=0.5)
    delivered = []
    for island in (made, sent):
        train(island, 3)
    meta, payload = made.make_update(0, "int4")

    sent_meta = sent.send_update(0, "int4", lambda m, pl: delivered.append(
        (m, pl, threading.current_thread())))
    sent.finish_encoding()

    (delivered_meta, delivered_payload, thread), = delivered
    assert thread is not threading.main_thread()
    assert sent_meta == delivered_meta == meta
    assert all(torch.equal(delivered_payload[n], payload[n]) for n in payload)
    # A mix right after the send sees what was sent, as after make_update.
    global_tensors = {n: t + 0.01 for n, t in made.state[0].anchor.items()}
    made.mix_global(0, global_tensors, 1)
    sent.mix_global(0, global_tensors, 1)
    assert all(torch.equal(sent.params[n], made.params[n]) for n in global_tensors)


def test_the_next_backward_pass_waits_for_the_update_being_encoded(island_of):
    island = island_of()
    train(island, 1)
    forward_ran, backward_began = threading.Event(), threading.Event()
    order = []
    island.model.register_forward_hook(lambda *args: forward_ran.set())

    def began(grad: torch.Tensor) -> None:
        order.append("backward")
        backward_began.set()

    next(iter(island.model.parameters())).register_hook(began)

    def deliver(meta: dict, payload: dict) -> None:
        # Still encoding when the forward pass ends. A backward pass that did not wait
        # would begin now, and be seen to; one that waits lets the wait run out.
        assert forward_ran.wait(timeout=30)
        backward_began.wait(timeout=1.0)
        order.append("delivered")

    island.send_update(0, "int8", deliver)
    island.inner_step()

    assert order == ["delivered", "backward"]


def test_an_error_on_the_encoding_thread_is_raised_on_the_training_thread(island_of):
    island = island_of()
    train(island, 1)

    def deliver(meta: dict, payload: dict) -> None:
        raise ConnectionError("the data plane is gone")

    island.send_update(0, "none", deliver)
    with pytest.raises(ConnectionError, match="data plane is gone"):
        island.inner_step()
    island.inner_step()  # raised once
