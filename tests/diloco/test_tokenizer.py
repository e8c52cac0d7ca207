"""The run's tokenizer (diloco/tokenizer.py) and the config's rules on it."""

import json

import pytest

from diloco import tokenizer as tokenizers
from diloco.config_parse import ConfigError
from diloco.island import build_model, gpt_config
from diloco.shapes import tensor_sizes
from diloco.tokenizer import Tokenizer, TokenizerError, train_bpe, vocab_of
from tests.diloco.test_hf import TINY_LLAMA

TEXTS = [f"Island {i} trains the model and sends its update to syncd.\n" * 3
         for i in range(200)]


def folder_of(tmp_path, tokenizer: Tokenizer):
    folder = tmp_path / "tok"
    folder.mkdir(exist_ok=True)
    (folder / "tokenizer.json").write_text(tokenizer.json_text)
    return folder


def test_the_bytes_tokenizer_makes_the_byte_values_and_ends_a_document_with_nul():
    made = Tokenizer()

    assert made.encode(["hé"]) == [[104, 195, 169]]
    assert (made.vocab_size, made.eos, made.sha256, made.dtype_bytes()) == (256, 0, "bytes", 1)


def test_a_trained_bpe_has_its_vocab_size_an_eos_and_is_the_same_each_time():
    one, two = train_bpe(iter(TEXTS), 400), train_bpe(iter(TEXTS), 400)

    assert one.sha256 == two.sha256
    assert one.vocab_size == 400
    assert one.eos == 0 and one.eos_token == "<|endoftext|>"
    ids = one.encode(["Island 7 trains"])[0]
    assert len(ids) < len("Island 7 trains")  # merges learnt
    assert one.library.decode(ids) == "Island 7 trains"
    assert one.dtype_bytes() == 2


def test_a_vocabulary_beyond_65536_ids_is_stored_as_uint32():
    from tokenizers import Tokenizer as Library
    from tokenizers import models

    words = Library(models.WordLevel({f"w{i}": i for i in range(70_000)}, unk_token="w0"))

    assert Tokenizer(words.to_str()).dtype_bytes() == 4


def test_a_folders_vocabulary_counts_its_added_tokens(tmp_path):
    made = train_bpe(iter(TEXTS), 300)
    made.library.add_special_tokens(["<pad>"])
    folder = folder_of(tmp_path, Tokenizer(made.library.to_str()))

    assert vocab_of(type("D", (), {"tokenizer": str(folder), "vocab_size": 0})) == 301


@pytest.mark.parametrize(("make", "says"), [
    (lambda p: p / "missing", "no folder at"),
    (lambda p: p, "holds no tokenizer.json"),
])
def test_a_folder_without_a_tokenizer_is_refused(tmp_path, make, says):
    with pytest.raises(TokenizerError, match=says):
        tokenizers.from_folder(str(make(tmp_path)))


def test_the_byte_tokenizer_json_gives_each_byte_its_value():
    from tokenizers import Tokenizer as Library

    made = Library.from_str(tokenizers.byte_tokenizer_json())

    text = "héllo\n\t wörld"
    assert made.encode(text).ids == list(text.encode())
    assert made.decode(list(text.encode())) == text


def test_the_builtin_model_takes_the_tokenizers_vocabulary(make_config):
    config = make_config(data={"tokenizer": "train", "vocab_size": 1000})

    assert tensor_sizes(config.model, 1000) == {
        n: p.numel() for n, p in build_model(gpt_config(config)).state_dict().items()}
    assert build_model(gpt_config(config)).tok_emb.weight.shape[0] == 1000


def test_an_hf_config_without_vocab_size_takes_the_tokenizers(make_config):
    llama = {k: v for k, v in TINY_LLAMA.items() if k != "vocab_size"}
    config = make_config(model={"source": "hf", "hf_config": json.dumps(llama),
                                "block_size": 16},
                         data={"tokenizer": "train", "vocab_size": 700})

    assert json.loads(gpt_config(config).hf_json)["vocab_size"] == 700


def test_a_tokenizer_that_does_not_fit_an_hf_models_embedding_is_refused_at_its_field(
        make_config):
    with pytest.raises(ConfigError) as e:
        make_config(model={"source": "hf", "hf_config": json.dumps(TINY_LLAMA),
                           "block_size": 16}, data={"tokenizer": "train", "vocab_size": 700})

    assert "do not fit the model's embedding of 256" in " ".join(e.value.errors["data.tokenizer"])
    assert set(e.value.errors) == {"data.tokenizer"}


@pytest.mark.parametrize(("data", "field", "says"), [
    ({"tokenizer": "/no/such/folder"}, "data.tokenizer", "no folder at"),
    ({"tokenizer": "train", "vocab_size": 100}, "data.vocab_size", "between 257"),
    ({"text_field": " "}, "data.text_field", "required"),
])
def test_a_bad_tokenizer_setting_is_refused_at_its_field(make_config, data, field, says):
    with pytest.raises(ConfigError) as e:
        make_config(data=data)

    assert says in " ".join(e.value.errors[field])
