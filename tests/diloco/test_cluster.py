import math
from dataclasses import replace

import pytest
import torch

from diloco.cluster import run_local
from diloco.data import load_corpus
from diloco.evaluation import Evaluator
from diloco.island import initial_model
from diloco.synchronizer import Synchronizer
from syncd.environment import data_dir


def assert_same_params(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float):
    assert a.keys() == b.keys()
    for name in a:
        assert torch.allclose(a[name], b[name], rtol=0, atol=atol), name


def moved_from_init(config, params: dict[str, torch.Tensor]) -> float:
    init = initial_model(config).state_dict()
    return max((params[n] - init[n]).abs().max().item() for n in init)


def test_decoupled_with_a_full_quorum_and_endless_grace_is_plain_diloco(make_config):
    # K = M, uniform weights, one fragment, no overlap, alpha 0: every merge waits
    # for every island and replaces each island's copy, which is what "sync" does.
    config = make_config(
        islands=3,
        sync={"inner_steps": 2, "fragments": 1, "overlap_steps": 0, "alpha": 0.0,
              "min_quorum": 3, "weighting": "uniform"},
        optim={"inner_lr": 1e-2, "warmup_steps": 0},
        budget={"total_tokens": 3 * 2 * 3 * 4 * 16},  # 3 rounds of H = 2 steps
    )
    config = replace(config, sync=replace(config.sync, grace_gamma=math.inf))

    decoupled = run_local(config, "decoupled", data_dir=data_dir(), eval_points=1)
    sync = run_local(config, "sync", data_dir=data_dir(), eval_points=1)

    assert decoupled.outer_steps == sync.outer_steps == 3
    assert decoupled.tokens == sync.tokens == config.budget.total_tokens
    assert moved_from_init(config, sync.params) > 1e-2
    assert_same_params(decoupled.params, sync.params, atol=1e-6)


def test_one_island_syncing_every_step_with_outer_lr_1_is_plain_adamw(make_config):
    config = make_config(
        islands=1,
        sync={"inner_steps": 1, "fragments": 1, "overlap_steps": 0, "alpha": 0.0,
              "min_quorum": 1},
        optim={"outer_lr": 1.0, "outer_momentum": 0.0, "inner_lr": 1e-2, "warmup_steps": 4},
    )

    decoupled = run_local(config, "decoupled", data_dir=data_dir(), eval_points=1)
    dp = run_local(config, "dp", data_dir=data_dir(), eval_points=1)

    assert decoupled.outer_steps == dp.outer_steps == 1024 // (4 * 16)
    assert moved_from_init(config, dp.params) > 1e-2
    assert_same_params(decoupled.params, dp.params, atol=1e-5)


def test_it_counts_the_bytes_of_both_directions(make_config):
    # Plain DiLoCo, one fragment, fp32 both ways: per round, every island sends
    # its update up and receives the merged fragment down, 4 N bytes each.
    config = make_config(islands=2, sync={"inner_steps": 4, "fragments": 1,
                                          "compression": "none"})

    result = run_local(config, "sync", data_dir=data_dir(), eval_points=1)

    n = result.model_params
    rounds, islands = result.outer_steps, 2
    assert rounds == 1024 // (4 * 2 * 4 * 16)
    fp32_one_way = rounds * islands * 4 * n
    header_room = rounds * islands * 2 * 8192  # safetensors header, HMAC tag
    assert 2 * fp32_one_way <= result.bytes_sent <= 2 * fp32_one_way + header_room


def test_data_parallel_bytes_follow_the_ring_all_reduce(make_config):
    config = make_config(islands=4, batch_size=2)

    result = run_local(config, "dp", data_dir=data_dir(), eval_points=1)

    n, m = result.model_params, 4
    steps = result.outer_steps
    assert steps == math.ceil(1024 / (m * 2 * 16))
    per_island_per_step = 2 * (2 * (m - 1) / m * 4 * n)  # send and receive 2(M-1)/M of fp32
    assert result.bytes_sent == steps * m * per_island_per_step


def test_int4_updates_send_fewer_bytes_than_fp32(make_config):
    def bytes_with(codec: str) -> int:
        config = make_config(sync={"inner_steps": 4, "fragments": 2, "compression": codec,
                                   "min_quorum": 2})
        result = run_local(config, "decoupled", data_dir=data_dir(), eval_points=1)
        assert result.merges > 0
        return result.bytes_sent

    fp32, int4 = bytes_with("none"), bytes_with("int4")

    assert 0 < int4 < 0.75 * fp32  # the uplink shrinks to about 1/7, the downlink stays


def test_a_run_reports_its_tokens_and_a_finite_loss_at_each_eval_point(make_config):
    config = make_config(sync={"inner_steps": 4, "fragments": 2})
    points = []

    result = run_local(config, "decoupled", data_dir=data_dir(), eval_points=3,
                       progress=points.append)

    assert result.tokens >= config.budget.total_tokens
    assert 0 < result.tokens_merged <= result.tokens
    assert result.bytes_sent > 0
    assert len(result.curve) == 3
    assert points == result.curve
    assert all(math.isfinite(p["eval_loss"]) for p in result.curve)
    assert result.eval_loss == result.curve[-1]["eval_loss"]
    assert result.virtual_time_s > 0


def test_the_grace_window_is_sized_with_the_round_trip_of_a_fragment(make_config, monkeypatch):
    # syncd's round_stats passes t_sync = upload + download; so does the cluster, where
    # it passed the download alone. 200 ms each way; a fragment's bytes take far less.
    config = make_config(sync={"inner_steps": 4, "fragments": 2, "min_quorum": 1})
    config = replace(config, islands=[replace(i, latency_ms=200.0) for i in config.islands])
    sync_times = []
    decide = Synchronizer.decide

    def spy(self, fragment, now, alive_islands, stats, barrier=False, waiting=False):
        sync_times.append(stats.sync_time_s)
        return decide(self, fragment, now, alive_islands, stats, barrier, waiting)

    monkeypatch.setattr(Synchronizer, "decide", spy)
    run_local(config, "decoupled", data_dir=data_dir(), eval_points=1)

    after_a_merge = [t for t in sync_times if t > 0]
    assert after_a_merge
    assert all(0.4 < t < 0.41 for t in after_a_merge)


def test_a_run_evaluates_on_the_validation_split(make_config):
    # The curve and the final eval loss are what a real run shows: never the test split.
    config = make_config(sync={"inner_steps": 4, "fragments": 2})
    corpus = load_corpus(config.data.path, config.data.eval_fraction, data_dir())

    result = run_local(config, "decoupled", data_dir=data_dir(), eval_points=1)

    assert result.eval_loss == Evaluator(config, corpus, "validation")(result.params)
    assert result.eval_loss != Evaluator(config, corpus, "test")(result.params)


def test_it_rejects_an_unknown_mode(make_config):
    with pytest.raises(ValueError, match="mode must be one of decoupled, sync, dp, got 'ring'"):
        run_local(make_config(), "ring", data_dir=data_dir())


def test_it_rejects_a_step_time_that_is_not_positive(make_config):
    with pytest.raises(ValueError, match="step_time_s must be positive"):
        run_local(make_config(), "dp", data_dir=data_dir(), step_time_s=0)
