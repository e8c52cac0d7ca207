import pytest
import torch

from diloco import codecs
from diloco.fragments import partition
from diloco.island import gpt_config
from diloco.model import GPT
from diloco.shapes import tensor_sizes
from diloco.sizes import MIB, activation_bytes, encoded_bytes, estimate

SHAPES = [(1, 8, 2, 8), (2, 64, 4, 64), (3, 48, 6, 128), (4, 96, 8, 32)]


@pytest.mark.parametrize(("n_layer", "n_embd", "n_head", "block_size"), SHAPES)
def test_the_parameter_count_is_that_of_the_model_built(make_config, n_layer, n_embd, n_head,
                                                        block_size):
    config = make_config(model={"n_layer": n_layer, "n_embd": n_embd, "n_head": n_head,
                                "block_size": block_size})
    model = GPT(gpt_config(config))

    assert estimate(config).params == model.num_params()
    assert estimate(config).model_bytes == 4 * model.num_params()
    assert tensor_sizes(config.model) == {n: p.numel() for n, p in model.named_parameters()}


@pytest.mark.parametrize("codec", codecs.CODECS)
@pytest.mark.parametrize("numel", [1, 63, 64, 65, 1000])
def test_the_encoded_size_is_that_of_the_codec_payload(codec, numel):
    payload = codecs.encode({"t": torch.randn(numel)}, codec)

    assert encoded_bytes(numel, codec) == codecs.payload_nbytes(payload)


def test_the_activation_estimate_is_korthikantis_formula_doubled_for_fp32():
    # s b h L (34 + 5 a s / h) bytes at 16 bits: 128 x 2 x 768 x 16 x (34 + 5 x 12 x 128 / 768)
    sixteen_bit = 128 * 2 * 768 * 16 * (34 + 5 * 12 * 128 // 768)

    assert activation_bytes(2, 128, 16, 768, 12, "bf16") == sixteen_bit
    assert activation_bytes(2, 128, 16, 768, 12, "fp32") == 2 * sixteen_bit


def test_each_total_is_the_sum_of_its_parts_as_the_formulas_give_them(make_config):
    config = make_config(islands=3, batch_size=4, model={"n_layer": 2, "n_embd": 64},
                         sync={"fragments": 4, "compression": "none",
                               "downlink_compression": "none"})
    sized = estimate(config)
    b = sized.model_bytes
    f = 4 * max(f.numel for f in partition(tensor_sizes(config.model), 4))  # the largest
    act = activation_bytes(4, 16, 2, 64, config.model.n_head, "fp32")

    # The outer momentum is syncd's alone (its files), not Redis's: 2 unhandled each.
    assert sized.redis.total == b + f + 2 * 3 * b + 64 * MIB
    # One round sum per fragment (b in all) whatever the three islands, one update folding.
    assert sized.syncd.total == 2 * b + b + f + 2 * f + b
    island = sized.islands["island-0"]
    assert island.total == 6 * b + 2 * f + 2 * f + (2 * 4 + 1) * f + 2 * b + 2 * f + act
    assert island.total == sum(island.parts.values())
    assert sized.to_dict()["islands"]["island-0"]["total"] == island.total


def test_lossy_codecs_shrink_the_blobs_and_keep_differences_for_the_downlink(make_config):
    none = estimate(make_config(islands=4, sync={"compression": "none"}))
    int4 = estimate(make_config(islands=4, sync={"compression": "int4",
                                                 "downlink_compression": "bf16",
                                                 "max_staleness": 3}))
    b = none.model_bytes

    assert none.redis.parts["update blobs"] == 2 * 4 * b
    assert 8 * b * 0.14 < int4.redis.parts["update blobs"] < 8 * b * 0.15
    assert none.redis.parts["downlink differences"] == 0
    assert int4.redis.parts["downlink differences"] == 3 * b // 2
    assert int4.syncd.parts["downlink differences"] == 3 * b // 2


def test_an_island_of_several_processes_holds_each_ones_state_and_splits_the_batch(
        make_config):
    one = estimate(make_config(batch_size=8)).islands["island-0"]
    two = estimate(make_config(batch_size=8, islands=2)).islands["island-0"]
    config = make_config(batch_size=8)
    config.islands[0].processes = 2
    split = estimate(config).islands["island-0"]

    assert one == two
    assert split.parts["parameters"] == 2 * one.parts["parameters"]
    assert split.parts["DDP gradient buckets"] == 2 * one.parts["parameters"]
    assert split.parts["activations"] == one.parts["activations"]


def test_no_outer_momentum_keeps_no_momentum_buffers(make_config):
    sized = estimate(make_config(optim={"outer_momentum": 0.0}))

    assert sized.syncd.parts["outer momentum"] == 0


def test_the_outer_momentum_is_syncds_alone_and_takes_no_redis_memory(make_config):
    config = make_config()
    sized = estimate(config)
    largest = max(f.numel for f in partition(tensor_sizes(config.model),
                                             config.sync.fragments))

    assert sized.syncd.parts["outer momentum"] == sized.model_bytes
    assert "outer momentum" not in sized.redis.parts
    assert sized.redis.parts["fragment in swap"] == 4 * largest


def test_each_warm_standby_of_an_island_host_counts_with_its_interpreter_and_a_model(
        make_config):
    from diloco.sizes import STANDBY_BASE_BYTES

    config = make_config(islands=2)
    cold, warm = estimate(config), estimate(config, standbys=2)
    for name, need in warm.islands.items():
        assert need.parts["warm standbys"] == 2 * (STANDBY_BASE_BYTES + warm.model_bytes)
        assert need.total == cold.islands[name].total + need.parts["warm standbys"]
    assert "warm standbys" not in cold.islands["island-0"].parts
