from pathlib import Path

import pytest
import torch

from trainer.data import Corpus, ShardSampler, default_corpus_root, eval_batches, load_corpus


def corpus_of(train: bytes, eval: bytes = b"e" * 300) -> Corpus:
    as_tensor = lambda b: torch.frombuffer(bytearray(b), dtype=torch.uint8).clone()  # noqa: E731
    return Corpus(train=as_tensor(train), eval=as_tensor(eval), source="test")


def write_files(folder: Path, count: int) -> dict[str, bytes]:
    """`count` text files whose contents cannot be mistaken for one another."""
    folder.mkdir(parents=True, exist_ok=True)
    contents = {}
    for i in range(count):
        body = (f"# file {i:03d}\n" + f"value_{i:03d} = {i * 7919}\n" * 12).encode()
        (folder / f"module_{i:03d}.py").write_bytes(body)
        contents[f"module_{i:03d}.py"] = body
    return contents


def test_the_shards_of_different_islands_are_disjoint():
    # Shard 0 of 2 is all "a", shard 1 all "b": a window from either holds one letter.
    corpus = corpus_of(b"a" * 1000 + b"b" * 1000)
    shards = [ShardSampler(corpus, i, 2, block_size=16, seed=0) for i in range(2)]

    for sampler, letter in zip(shards, b"ab", strict=True):
        for _ in range(5):
            x, y = sampler.batch(8)
            assert set(x.flatten().tolist()) == {letter}
            assert set(y.flatten().tolist()) == {letter}


def test_a_batch_targets_are_the_inputs_shifted_by_one_byte():
    corpus = corpus_of(bytes(range(256)) * 8)
    x, y = ShardSampler(corpus, 0, 1, block_size=16, seed=0).batch(4)

    assert x.shape == y.shape == (4, 16)
    assert x.dtype == torch.long
    assert torch.equal(y[:, :-1], x[:, 1:])
    assert torch.equal(y[:, -1], (x[:, -1] + 1) % 256)


def test_the_same_seed_gives_the_same_batches():
    corpus = corpus_of(bytes(range(256)) * 16)
    a, b, other = (ShardSampler(corpus, 1, 2, block_size=16, seed=s) for s in (7, 7, 8))

    for _ in range(3):
        xa, ya = a.batch(4)
        xb, yb = b.batch(4)
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert not torch.equal(a.batch(4)[0], other.batch(4)[0])


def test_a_restored_sampler_state_replays_the_same_batches():
    sampler = ShardSampler(corpus_of(bytes(range(256)) * 16), 0, 2, block_size=16, seed=0)
    state = sampler.state()
    first = sampler.batch(4)[0]

    sampler.set_state(state)

    assert torch.equal(sampler.batch(4)[0], first)


def test_it_rejects_a_shard_outside_the_range():
    with pytest.raises(ValueError, match="shard must be between 0 and 1, got 2"):
        ShardSampler(corpus_of(b"x" * 2000), 2, 2, block_size=16, seed=0)


def test_it_rejects_shards_too_small_for_one_window():
    with pytest.raises(ValueError, match="fewer than block_size"):
        ShardSampler(corpus_of(b"x" * 2000), 0, 100, block_size=32, seed=0)


def test_a_user_folder_of_text_files_is_split_into_train_and_eval_by_file(tmp_path):
    contents = write_files(tmp_path / "texts", 30)
    (tmp_path / "texts" / "image.png").write_bytes(b"\x89PNG not text")

    corpus = load_corpus(str(tmp_path / "texts"), eval_fraction=0.3)
    train, held_out = bytes(corpus.train.tolist()), bytes(corpus.eval.tolist())

    assert corpus.source == str(tmp_path / "texts")
    assert len(train) + len(held_out) == sum(map(len, contents.values()))
    in_train = {name for name, body in contents.items() if body in train}
    in_eval = {name for name, body in contents.items() if body in held_out}
    assert in_train and in_eval
    assert in_train.isdisjoint(in_eval)
    assert in_train | in_eval == set(contents)


def test_a_single_file_is_split_by_bytes(text_path):
    corpus = load_corpus(text_path, eval_fraction=0.1)
    whole = Path(text_path).read_bytes()

    assert len(corpus.eval) == len(whole) - int(len(whole) * 0.9)
    assert bytes(corpus.train.tolist()) + bytes(corpus.eval.tolist()) == whole


def test_a_path_that_does_not_exist_is_reported_with_the_path(tmp_path):
    missing = tmp_path / "no-such-corpus"

    with pytest.raises(ValueError, match="no-such-corpus"):
        load_corpus(str(missing))


def test_it_rejects_a_corpus_too_small_to_train_on(tmp_path):
    (tmp_path / "tiny.txt").write_text("too short")

    with pytest.raises(ValueError, match="too small"):
        load_corpus(str(tmp_path / "tiny.txt"))


def test_the_default_corpus_is_the_standard_library_sources():
    corpus = load_corpus()

    assert corpus.source == str(default_corpus_root())
    assert len(corpus.train) > 1_000_000
    assert 0 < len(corpus.eval) < len(corpus.train) * 0.2
    assert b"def " in bytes(corpus.train[:100_000].tolist())


def test_the_eval_batches_are_the_same_evenly_spaced_windows_every_time():
    corpus = corpus_of(b"t" * 2000, eval=bytes(range(256)) * 4)

    first = eval_batches(corpus, tokens=640, block_size=16, batch_size=32)
    again = eval_batches(corpus, tokens=640, block_size=16, batch_size=32)

    assert [len(x) for x, _ in first] == [32, 8]
    assert all(torch.equal(a[0], b[0]) for a, b in zip(first, again, strict=True))
    x, y = first[0]
    assert x[0, 0].item() == 0  # the first window starts at the first eval byte
    assert torch.equal(y[:, :-1], x[:, 1:])
