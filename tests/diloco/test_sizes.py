import pytest
import torch

from diloco import codecs
from diloco.config import CODECS
from diloco.fragments import partition
from diloco.island import gpt_config
from diloco.model import GPT
from diloco.shapes import tensor_sizes
from diloco.sizes import (
    MIB,
    activation_bytes,
    encoded_bytes,
    estimate,
    expected_process,
    kept_sends,
    unmixed_fragments,
    wire_per_outer_step,
)

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


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("numel", [1, 63, 64, 65, 1000])
def test_the_encoded_size_is_that_of_the_codec_payload(codec, numel):
    payload = codecs.encode({"t": torch.randn(numel)}, codec)

    assert encoded_bytes(numel, codec) == codecs.payload_nbytes(payload)


def test_the_activation_estimate_is_korthikantis_formula_doubled_for_fp32():
    # s b h L (34 + 5 a s / h) bytes at 16 bits: 128 x 2 x 768 x 16 x (34 + 5 x 12 x 128 / 768)
    sixteen_bit = 128 * 2 * 768 * 16 * (34 + 5 * 12 * 128 // 768)

    assert activation_bytes(2, 128, 16, 768, 12, "bf16") == sixteen_bit
    assert activation_bytes(2, 128, 16, 768, 12, "fp32") == 2 * sixteen_bit


def test_the_update_messages_in_redis_are_the_upload_slots_whatever_the_islands(make_config):
    def messages(islands: int, slots: int) -> int:
        return estimate(make_config(islands=islands, sync={"upload_slots": slots})).redis.parts[
            "update messages"]

    assert messages(2, 2) == messages(16, 2)
    assert messages(16, 3) == 3 * messages(16, 2) // 2


def test_each_total_is_the_sum_of_its_parts_as_the_formulas_give_them(make_config):
    config = make_config(islands=3, batch_size=4, model={"n_layer": 2, "n_embd": 64},
                         sync={"fragments": 4, "compression": "none",
                               "downlink_compression": "none"})
    sized = estimate(config, served=False)
    b = sized.model_bytes
    f = 4 * max(f.numel for f in partition(tensor_sizes(config.model), 4))  # the largest
    act = activation_bytes(4, 16, 2, 64, config.model.n_head, "fp32")

    # The outer momentum is syncd's alone (its files), not Redis's; two upload slots.
    assert sized.redis.total == b + f + 2 * f + 64 * MIB
    # One round sum per fragment (b in all) whatever the three islands, one update folding,
    # and syncd's process base.
    assert sized.syncd.total == 2 * b + b + f + 2 * f + f + b + 512 * MIB
    island = sized.islands["island-0"]
    assert island.total == 6 * b + 2 * f + 2 * f + (2 * 4 + 1) * f + 2 * b + 2 * f + act
    assert island.total == sum(island.parts.values())
    assert sized.to_dict()["islands"]["island-0"]["total"] == island.total


def test_lossy_codecs_shrink_the_messages_and_keep_differences_for_the_downlink(make_config):
    none = estimate(make_config(islands=4, sync={"compression": "none", "fragments": 1}))
    int4 = estimate(make_config(islands=4, sync={"compression": "int4", "fragments": 1,
                                                 "downlink_compression": "bf16",
                                                 "max_staleness": 3}))
    b = none.model_bytes

    assert none.redis.parts["update messages"] == 2 * b
    assert 2 * b * 0.14 < int4.redis.parts["update messages"] < 2 * b * 0.15
    assert none.redis.parts["downlink differences"] == 0
    assert int4.redis.parts["downlink differences"] == 3 * b // 2
    assert int4.syncd.parts["downlink differences"] == 3 * b // 2


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("islands", [1, 2, 3, 4, 16])
def test_an_island_keeps_no_more_bytes_of_sends_than_two_float32_messages(codec, islands):
    numel = 1_000_000
    kept = kept_sends(codec, islands)

    assert kept >= 2  # one in an open round, one on the way
    assert kept * encoded_bytes(numel, codec) <= 2 * encoded_bytes(numel, "none")


def test_a_compressed_uplink_keeps_more_sends_only_where_few_islands_fill_a_round():
    # The islands' kept sends together: at least 8 where the bytes allow, never fewer
    # than two each.
    assert [kept_sends("int4", m) for m in (1, 2, 3, 4, 8, 16)] == [4, 4, 3, 2, 2, 2]
    assert [kept_sends("none", m) for m in (1, 2, 3, 4)] == [2, 2, 2, 2]


def test_the_island_estimate_counts_the_sends_it_keeps(make_config):
    config = make_config(islands=2, sync={"compression": "int4", "fragments": 2})
    none = estimate(make_config(islands=2, sync={"compression": "none", "fragments": 2}))
    int4 = estimate(config)
    up = sum(encoded_bytes(n, "int4") for n in tensor_sizes(config.model).values())

    assert none.islands["island-0"].parts["kept until handled"] == 2 * none.model_bytes
    assert int4.islands["island-0"].parts["kept until handled"] == 4 * up


@pytest.mark.parametrize(("codec", "islands", "error"), [("zip", 2, "codec must be one of"),
                                                         ("int4", 0, "at least one island")])
def test_an_unknown_codec_or_a_run_without_islands_keeps_no_sends(codec, islands, error):
    with pytest.raises(ValueError, match=error):
        kept_sends(codec, islands)


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
    sized = estimate(config, served=False)
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


def test_the_expected_island_holds_its_state_one_step_and_one_fragment_unmixed(
        make_config):
    config = make_config(islands=2, batch_size=4, model={"n_layer": 2, "n_embd": 64},
                         sync={"fragments": 4, "inner_steps": 8, "overlap_steps": 1,
                               "compression": "none", "downlink_compression": "none"})
    sized = estimate(config)
    b = sized.model_bytes
    f = 4 * max(f.numel for f in partition(tensor_sizes(config.model), 4))
    act = activation_bytes(4, 16, 2, 64, config.model.n_head, "fp32")

    expected = sized.expected["island-0"]
    # Parameters, gradients, two moments, anchors; one kept message of each fragment
    # (B in float32); one fragment's decoded send and its pulled global; one step.
    assert expected.total == 5 * b + b + f + f + act
    assert expected.total == sum(expected.parts.values())
    assert expected.total < sized.islands["island-0"].total
    assert sized.to_dict()["expected"]["island-0"]["total"] == expected.total


def test_the_expected_island_keeps_one_encoded_message_of_each_fragment(make_config):
    config = make_config(sync={"fragments": 2, "compression": "int4",
                               "downlink_compression": "int8"})
    sizes = tensor_sizes(config.model)
    expected = estimate(config).expected["island-0"].parts
    fragments = partition(sizes, 2)

    assert expected["kept until handled"] == sum(encoded_bytes(n, "int4")
                                                 for n in sizes.values())
    assert expected["fragment being pulled"] == max(
        sum(encoded_bytes(sizes[n], "int8") for n in f.tensor_names) for f in fragments)
    assert expected["sent since the last mix"] == 4 * max(f.numel for f in fragments)


@pytest.mark.parametrize(("h", "p", "tau", "fragments"),
                         [(50, 4, 2, 1), (8, 4, 1, 1), (8, 4, 3, 2), (4, 4, 4, 4),
                          (4, 4, 9, 4), (16, 2, 0, 0), (1, 1, 1, 1)])
def test_unmixed_fragments_are_those_sent_within_tau_steps_of_each_other(h, p, tau,
                                                                           fragments):
    assert unmixed_fragments(h, p, tau) == fragments


@pytest.mark.parametrize(("h", "p", "tau"), [(0, 1, 1), (8, 0, 1), (8, 2, -1)])
def test_unmixed_fragments_need_steps_fragments_and_a_tau_of_0_or_more(h, p, tau):
    with pytest.raises(ValueError, match=r"at least one inner step|0 or more"):
        unmixed_fragments(h, p, tau)


def test_an_island_that_mixes_before_its_next_step_holds_no_unmixed_fragment():
    parts = expected_process(100, 50, 50, 100, 0, {"activations": 30}, ddp=False)

    assert parts["sent since the last mix"] == parts["fragment being pulled"] == 0
    assert sum(parts.values()) == 5 * 100 + 100 + 30


def test_the_expected_island_of_several_processes_holds_each_ones_state(make_config):
    config = make_config(batch_size=8)
    one = estimate(config).expected["island-0"]
    config.islands[0].processes = 2
    split = estimate(config).expected["island-0"]

    assert split.parts["parameters"] == 2 * one.parts["parameters"]
    assert split.parts["DDP gradient buckets"] == 2 * one.parts["parameters"]
    assert one.parts["DDP gradient buckets"] == 0
    assert split.parts["activations"] == one.parts["activations"]


def test_an_island_hosts_warm_standbys_count_alike_in_its_expected_bytes(make_config):
    config = make_config()
    cold, warm = estimate(config), estimate(config, standbys=1)

    assert (warm.expected["island-0"].total - cold.expected["island-0"].total
            == warm.islands["island-0"].parts["warm standbys"])


# The tiny model of make_config (1 layer, 16 wide, context 16) by hand: tok_emb 256 x 16
# = 4096, pos_emb 16 x 16 = 256, c_attn 3 x 16 x 16 = 768, attn c_proj 256, c_fc and
# mlp c_proj 4 x 16 x 16 = 1024 each, lm_head 4096, and six LayerNorm vectors of 16:
# 11,616 values. In blocks of 64, tensor by tensor: 64 + 4 + 12 + 4 + 16 + 16 + 64 + 6 x 1
# = 186 blocks, each with a float32 scale.
TINY_FP32 = 4 * 11_616  # 46,464
TINY_INT8 = 186 * (64 + 4)  # 12,648
TINY_INT4 = 186 * (32 + 4)  # 6,696


def tiny_with_links(make_config, **sync):
    """The tiny model in 2 fragments, island-0 on a 10 Mb/s link of 40 ms, island-1 on
    1 Gb/s of 5 ms."""
    config = make_config(sync={"fragments": 2, **sync})
    for island, (gbps, ms) in zip(config.islands, [(0.01, 40.0), (1.0, 5.0)], strict=True):
        island.bandwidth_gbps, island.latency_ms = gbps, ms
    return config


def test_an_int4_uplink_sends_each_fragments_update_encoded_at_the_islands_link(make_config):
    wire = wire_per_outer_step(tiny_with_links(make_config, compression="int4"))

    # Two messages up, each its latency, and 6,696 bytes at the bandwidth.
    assert wire["island-0"].up_bytes == TINY_INT4
    assert wire["island-0"].up_s == pytest.approx(2 * 0.040 + TINY_INT4 * 8 / 0.01e9)
    assert wire["island-1"].up_bytes == TINY_INT4
    assert wire["island-1"].up_s == pytest.approx(2 * 0.005 + TINY_INT4 * 8 / 1e9)


def test_an_uplink_without_a_codec_sends_the_fp32_update(make_config):
    wire = wire_per_outer_step(tiny_with_links(make_config, compression="none"))

    assert wire["island-0"].up_bytes == TINY_FP32
    assert wire["island-0"].up_s == pytest.approx(2 * 0.040 + TINY_FP32 * 8 / 0.01e9)


def test_a_lossy_downlink_pulls_encoded_differences_and_none_the_fp32_fragments(make_config):
    lossy = wire_per_outer_step(tiny_with_links(make_config, downlink_compression="int8"))
    whole = wire_per_outer_step(tiny_with_links(make_config, downlink_compression="none"))

    assert lossy["island-0"].down_bytes == TINY_INT8
    assert lossy["island-0"].down_s == pytest.approx(2 * 0.040 + TINY_INT8 * 8 / 0.01e9)
    assert whole["island-0"].down_bytes == TINY_FP32
    assert whole["island-1"].down_s == pytest.approx(2 * 0.005 + TINY_FP32 * 8 / 1e9)


def test_each_fragment_is_a_message_of_its_own_that_pays_the_latency(make_config):
    one = make_config(sync={"fragments": 1, "compression": "int4"})
    four = make_config(sync={"fragments": 4, "compression": "int4"})
    latency = one.islands[0].latency_ms / 1000

    a, b = wire_per_outer_step(one)["island-0"], wire_per_outer_step(four)["island-0"]

    assert a.up_bytes == b.up_bytes == TINY_INT4  # codecs encode tensor by tensor
    assert b.up_s - a.up_s == pytest.approx(3 * latency)
    assert b.down_s - a.down_s == pytest.approx(3 * latency)


def test_the_emulations_bytes_scale_stretches_the_link_seconds_not_the_wire_bytes(
        make_config):
    plain = wire_per_outer_step(tiny_with_links(make_config))["island-0"]
    config = tiny_with_links(make_config)
    config.emulation.bytes_scale = 1000.0

    scaled = wire_per_outer_step(config)["island-0"]

    assert scaled.to_dict() == {"up_bytes": TINY_FP32, "down_bytes": TINY_FP32,
                                "up_s": scaled.up_s, "down_s": scaled.down_s}
    assert (scaled.up_bytes, scaled.down_bytes) == (plain.up_bytes, plain.down_bytes)
    assert scaled.up_s == pytest.approx(2 * 0.040 + 1000 * TINY_FP32 * 8 / 0.01e9)


def test_served_fragments_take_no_data_plane_memory_but_the_update_messages(make_config):
    config = make_config()
    on_redis, served = estimate(config, served=False), estimate(config)

    assert "global fragments" not in served.redis.parts
    assert "fragment in swap" not in served.redis.parts
    assert served.redis.total == on_redis.redis.total - on_redis.redis.parts[
        "global fragments"] - on_redis.redis.parts["fragment in swap"]
    assert served.syncd.total == on_redis.syncd.total
