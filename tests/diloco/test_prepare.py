"""Corpora prepared as token ids (diloco/prepare.py through diloco.data.load_corpus)."""

import json

import pytest
import torch

from diloco.data import bytes_per_token, load_corpus
from diloco.tokenizer import TOKENIZER_FILE, Tokenizer, train_bpe


@pytest.fixture
def jsonl(tmp_path):
    """A JSON Lines corpus of 3,000 documents, a bad line and a line without text."""
    lines = [json.dumps({"text": f"Document {i}: islands train one model; every {i % 7} "
                                 f"steps they send an update to syncd. ü{i}"})
             for i in range(3000)]
    lines[5], lines[9] = "{bad", json.dumps({"body": "x"})
    path = tmp_path / "c.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def documents(corpus, split: str, tokenizer: Tokenizer) -> list[str]:
    ids = getattr(corpus, split).tolist()
    return tokenizer.library.decode(ids, skip_special_tokens=False).split("<|endoftext|>")


def test_a_trained_bpe_prepares_whole_documents_each_ended_by_its_eos(jsonl, tmp_path):
    corpus = load_corpus(str(jsonl), 0.05, tmp_path / "data", tokenizer="train",
                         vocab_size=500)

    folder = next((tmp_path / "data" / "prepared").iterdir())
    tokenizer = Tokenizer((folder / TOKENIZER_FILE).read_text())
    assert corpus.train.dtype == torch.uint16
    assert corpus.tokenizer_sha256 == tokenizer.sha256 == corpus.meta["tokenizer"]["sha256"]
    source = {json.loads(line)["text"] for line in jsonl.read_text().splitlines()
              if line.startswith('{"text"')}
    held_out = documents(corpus, "validation", tokenizer)
    assert held_out[-1] == "" and set(held_out[:-1]) <= source  # whole documents
    every = [d for s in ("train", "validation", "test") for d in documents(corpus, s, tokenizer)]
    assert sorted(d for d in every if d) == sorted(source)
    assert corpus.meta["skipped_records"]["bad_json"] == 1
    assert corpus.meta["skipped_records"]["no_text"] == 1


def measured(corpus, split: str, tokenizer: Tokenizer) -> float:
    """The UTF-8 bytes of the split's text (EOS left out) per token of it."""
    return len("".join(documents(corpus, split, tokenizer)).encode()) / len(
        getattr(corpus, split))


@pytest.mark.parametrize("split", ["validation", "test"])
def test_bytes_per_token_of_a_held_out_split_is_measured_on_that_splits_text(
        jsonl, tmp_path, split):
    corpus = load_corpus(str(jsonl), 0.05, tmp_path / "data", tokenizer="train",
                         vocab_size=500)

    folder = next((tmp_path / "data" / "prepared").iterdir())
    tokenizer = Tokenizer((folder / TOKENIZER_FILE).read_text())
    assert bytes_per_token(corpus.meta, split) == pytest.approx(
        measured(corpus, split, tokenizer), rel=1e-12)
    assert bytes_per_token(corpus.meta, split) > 2  # merges: several bytes a token
    other = "test" if split == "validation" else "validation"
    assert bytes_per_token(corpus.meta, split) != bytes_per_token(corpus.meta, other)


def test_a_held_out_split_taken_from_trains_end_has_its_bytes_per_token_measured(tmp_path):
    words = ["a", "bb", "ccc", "dddd", "ü", "€€", "islands", "merge"]
    text = " ".join(words[i % len(words)] * (1 + i % 5) for i in range(6000))
    path = tmp_path / "one.txt"  # one text file: both held-out splits from train's end
    path.write_text("plain ascii words only. " * 400 + text)
    corpus = load_corpus(str(path), 0.1, tmp_path / "data", tokenizer="train",
                         vocab_size=300)

    folder = next((tmp_path / "data" / "prepared").iterdir())
    tokenizer = Tokenizer((folder / TOKENIZER_FILE).read_text())
    for split in ("validation", "test"):
        assert bytes_per_token(corpus.meta, split) == pytest.approx(
            measured(corpus, split, tokenizer), rel=1e-3)


def test_an_earlier_manifest_without_bytes_per_token_is_prepared_again(jsonl, tmp_path):
    load_corpus(str(jsonl), 0.05, tmp_path / "data", tokenizer="train", vocab_size=500)
    manifest = next((tmp_path / "data" / "prepared").iterdir()) / "manifest.json"
    earlier = json.loads(manifest.read_text())
    del earlier["bytes_per_token"]
    manifest.write_text(json.dumps(earlier))

    corpus = load_corpus(str(jsonl), 0.05, tmp_path / "data", tokenizer="train",
                         vocab_size=500)

    assert "bytes_per_token" in json.loads(manifest.read_text())
    assert bytes_per_token(corpus.meta, "validation") > 2


def test_every_host_trains_the_same_tokenizer_and_ids(jsonl, tmp_path):
    one = load_corpus(str(jsonl), 0.05, tmp_path / "a", tokenizer="train", vocab_size=500)
    two = load_corpus(str(jsonl), 0.05, tmp_path / "b", tokenizer="train", vocab_size=500)

    assert one.tokenizer_sha256 == two.tokenizer_sha256
    assert torch.equal(one.train, two.train)


def test_a_folder_tokenizer_prepares_its_own_ids_and_an_edited_one_prepares_anew(
        jsonl, tmp_path):
    folder = tmp_path / "tok"
    folder.mkdir()
    made = train_bpe((line for line in jsonl.read_text().splitlines()), 300)
    (folder / TOKENIZER_FILE).write_text(made.json_text)

    corpus = load_corpus(str(jsonl), 0.05, tmp_path / "data", tokenizer=str(folder))
    first = json.loads(jsonl.read_text().splitlines()[0])["text"]
    assert corpus.train[:len(made.encode([first])[0])].tolist() == made.encode([first])[0]
    assert corpus.tokenizer_sha256 == made.sha256

    other = train_bpe((line for line in jsonl.read_text().splitlines()), 350)
    (folder / TOKENIZER_FILE).write_text(other.json_text)
    again = load_corpus(str(jsonl), 0.05, tmp_path / "data", tokenizer=str(folder))
    assert again.tokenizer_sha256 == other.sha256
    assert len(list((tmp_path / "data" / "prepared").iterdir())) == 2


def test_a_text_folder_under_a_trained_bpe_ends_each_file_with_the_eos(tmp_path):
    corpus_dir = tmp_path / "texts"
    corpus_dir.mkdir()
    for i in range(60):
        (corpus_dir / f"f{i}.txt").write_text(f"file {i} says hello to island {i}\n" * 80)

    corpus = load_corpus(str(corpus_dir), 0.2, tmp_path / "data", tokenizer="train",
                         vocab_size=300)

    ids = torch.cat([corpus.train, corpus.validation, corpus.test])
    assert (ids == 0).sum().item() == 60  # the EOS, id 0, once per file


def test_a_jsonl_corpus_under_bytes_ends_each_document_with_nul(jsonl, tmp_path):
    corpus = load_corpus(str(jsonl), 0.05, tmp_path / "data")

    assert corpus.train.dtype == torch.uint8
    ids = torch.cat([corpus.train, corpus.validation, corpus.test])
    assert (ids == 0).sum().item() == 2998


def test_a_corpus_too_small_is_refused(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps({"text": "tiny"}) + "\n")

    with pytest.raises(ValueError, match="too small"):
        load_corpus(str(path), 0.05, tmp_path / "data", tokenizer="train", vocab_size=300)


def test_each_pass_logs_the_bytes_it_has_read_of_the_corpus(jsonl, tmp_path, caplog):
    caplog.set_level("INFO", logger="diloco.documents")
    watched = []
    load_corpus(str(jsonl), 0.05, tmp_path / "data", tokenizer="train", vocab_size=500,
                watch=watched.append)

    total = jsonl.stat().st_size
    for what in ("training the tokenizer", "tokenizing"):
        assert f"{what}: [{'#' * 20}] {total} of {total} bytes read (100%)" in caplog.text
    # The watcher was handed each pass as it began, and reads its counts at the end.
    assert [p.what for p in watched] == ["training the tokenizer", "tokenizing"]
    assert watched[-1].snapshot()["bytes_read"] == total
    counts = watched[-1].snapshot()
    assert counts["documents"] + counts["skipped"] == len(jsonl.read_text().splitlines())
    assert counts["skipped"] == 2
