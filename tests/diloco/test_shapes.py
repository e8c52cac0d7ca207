"""The GPT's shapes as arithmetic (diloco/shapes.py), against the model built with torch."""

import pytest

from diloco.island import gpt_config
from diloco.model import GPT
from diloco.shapes import VOCAB_SIZE, parameter_count, tensor_sizes

SHAPES = [(1, 8, 2, 8), (2, 32, 4, 16), (3, 24, 6, 64)]


@pytest.mark.parametrize(("n_layer", "n_embd", "n_head", "block_size"), SHAPES)
def test_each_tensor_is_named_sized_and_ordered_as_the_models_parameters(
        make_config, n_layer, n_embd, n_head, block_size):
    config = make_config(model={"n_layer": n_layer, "n_embd": n_embd, "n_head": n_head,
                                "block_size": block_size})
    model = GPT(gpt_config(config))

    assert list(tensor_sizes(config.model).items()) == [
        (name, p.numel()) for name, p in model.named_parameters()]
    assert parameter_count(config.model) == model.num_params()


def test_the_count_grows_by_one_blocks_tensors_per_layer(make_config):
    one = make_config(model={"n_layer": 1, "n_embd": 16, "n_head": 2, "block_size": 16}).model
    two = make_config(model={"n_layer": 2, "n_embd": 16, "n_head": 2, "block_size": 16}).model
    n = 16

    block = 2 * n + 3 * n * n + n * n + 2 * n + 4 * n * n + 4 * n * n  # 2 LayerNorms, 4 linears
    assert parameter_count(two) - parameter_count(one) == block
    assert len(tensor_sizes(two)) - len(tensor_sizes(one)) == 8
    assert tensor_sizes(one)["tok_emb.weight"] == tensor_sizes(one)["lm_head.weight"] == (
        VOCAB_SIZE * n)
