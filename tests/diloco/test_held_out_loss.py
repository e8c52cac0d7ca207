import math
from dataclasses import replace

import pytest

from diloco.config_parse import parse_config
from diloco.data import load_corpus
from diloco.evaluation import Evaluator, bits_per_byte
from syncd.environment import data_dir


def test_bits_per_byte_of_the_bytes_tokenizer_is_the_loss_in_bits():
    assert bits_per_byte(3 * math.log(2), 1.0) == pytest.approx(3.0)
    assert bits_per_byte(math.log(256), 1.0) == pytest.approx(8.0)  # uniform over bytes


def test_bits_per_byte_divides_by_the_bytes_each_token_stands_for():
    # 2.0 nats per token of 4 bytes: 2 / ln 2 = 2.885 bits per token, 0.721 per byte
    assert bits_per_byte(2.0, 4.0) == pytest.approx(2.0 / math.log(2) / 4.0)
    assert bits_per_byte(2.0, 4.0) == pytest.approx(0.72135, abs=1e-5)


@pytest.mark.parametrize("per_token", [0.0, -1.0, float("nan")])
def test_bits_per_byte_refuses_bytes_per_token_that_is_not_positive(per_token):
    with pytest.raises(ValueError, match="bytes per token"):
        bits_per_byte(2.0, per_token)


def test_the_evaluator_takes_the_bytes_per_token_of_the_split_it_evaluates(tmp_path,
                                                                          monkeypatch):
    monkeypatch.setenv("DATA_DIR", str(tmp_path / "data"))
    text = tmp_path / "corpus.txt"
    text.write_text("the islands train and the merge goes on.\n" * 400)
    config = parse_config({"model": {"n_layer": 1, "n_embd": 16, "n_head": 2,
                                     "block_size": 16},
                           "eval": {"tokens": 256}, "data": {"path": str(text)}}, ["us-east"])
    corpus = load_corpus(str(text), 0.05, data_dir())

    assert Evaluator(config, corpus, "validation").bytes_per_token == 1.0  # bytes
    tokenized = replace(corpus, meta={**corpus.meta,
                                      "bytes_per_token": {"validation": 3.5, "test": 4.5}})
    assert Evaluator(config, tokenized, "validation").bytes_per_token == 3.5
    assert Evaluator(config, tokenized, "test").bytes_per_token == 4.5
