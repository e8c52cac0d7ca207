import hashlib
import json
import os
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
import torch

from diloco import data
from diloco.data import (
    Corpus,
    ShardSampler,
    bytes_per_token,
    corpus_key,
    default_corpus_root,
    eval_batches,
    load_corpus,
    prepared_folder,
    split_of,
    text_files,
)
from syncd.environment import data_dir


@pytest.fixture(autouse=True)
def own_data_dir(tmp_path, monkeypatch):
    """Each test prepares its corpora in a data directory of its own."""
    monkeypatch.setenv("DATA_DIR", str(tmp_path / "data"))


def corpus_of(train: bytes, validation: bytes = b"v" * 300, test: bytes = b"t" * 300) -> Corpus:
    as_tensor = lambda b: torch.frombuffer(bytearray(b), dtype=torch.uint8).clone()  # noqa: E731
    return Corpus(train=as_tensor(train), validation=as_tensor(validation), test=as_tensor(test),
                  source="test")


def split_bytes(corpus: Corpus) -> dict[str, bytes]:
    return {s: bytes(getattr(corpus, s).tolist()) for s in data.SPLITS}


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


def test_a_user_folder_is_split_into_train_validation_and_test_disjoint_by_file(tmp_path):
    contents = write_files(tmp_path / "texts", 30)
    (tmp_path / "texts" / "image.png").write_bytes(b"\x89PNG not text")

    corpus = load_corpus(str(tmp_path / "texts"), eval_fraction=0.3, directory=data_dir())
    splits = split_bytes(corpus)

    assert corpus.source == str(tmp_path / "texts")
    assert sum(map(len, splits.values())) == sum(map(len, contents.values()))
    holders = {name: [s for s, b in splits.items() if body in b]
               for name, body in contents.items()}
    assert all(len(h) == 1 for h in holders.values()), holders  # each file in one split
    assert {h[0] for h in holders.values()} == set(data.SPLITS)


def test_each_split_holds_its_files_whole_in_sorted_path_order(tmp_path):
    contents = write_files(tmp_path / "texts", 30)

    splits = split_bytes(load_corpus(str(tmp_path / "texts"), 0.3, data_dir()))

    for split in data.SPLITS:
        assert splits[split] == b"".join(contents[n] for n in sorted(contents)
                                         if split_of(n, 0.3) == split)


def test_validation_is_the_old_eval_split_and_test_takes_files_that_were_train():
    # Format 1 held out the files whose path hash fell below eval_fraction, and tuning
    # read them: they are validation now, and test is files that no evaluation read.
    names = [rel for rel, _ in text_files(default_corpus_root())]
    old_eval = {n for n in names if zlib.crc32(n.encode()) % 1000 < 50}

    by_split = {s: {n for n in names if split_of(n, 0.05) == s} for s in data.SPLITS}

    assert by_split["validation"] == old_eval
    assert by_split["test"] and by_split["test"].isdisjoint(old_eval)
    assert 0.03 < len(by_split["test"]) / len(names) < 0.07


def test_a_single_file_is_split_by_bytes_with_validation_at_the_end_as_eval_was(text_path):
    corpus = load_corpus(text_path, eval_fraction=0.1, directory=data_dir())
    whole = Path(text_path).read_bytes()
    share = int(len(whole) * 0.1)
    splits = split_bytes(corpus)

    assert len(splits["validation"]) == len(splits["test"]) == share
    assert splits["train"] + splits["test"] + splits["validation"] == whole


def test_a_path_that_does_not_exist_is_reported_with_the_path(tmp_path):
    missing = tmp_path / "no-such-corpus"

    with pytest.raises(ValueError, match="no-such-corpus"):
        load_corpus(str(missing), 0.05, data_dir())


def test_it_rejects_a_corpus_too_small_to_train_on(tmp_path):
    (tmp_path / "tiny.txt").write_text("too short")

    with pytest.raises(ValueError, match="too small"):
        load_corpus(str(tmp_path / "tiny.txt"), 0.05, data_dir())


def test_the_default_corpus_is_the_standard_library_sources():
    corpus = load_corpus("", 0.05, data_dir())

    assert corpus.source == str(default_corpus_root())
    assert len(corpus.train) > 1_000_000
    assert 0 < len(corpus.validation) < len(corpus.train) * 0.1
    assert 0 < len(corpus.test) < len(corpus.train) * 0.1
    assert b"def " in bytes(corpus.train[:100_000].tolist())


def test_the_eval_batches_are_the_same_evenly_spaced_windows_every_time():
    corpus = corpus_of(b"r" * 2000, validation=bytes(range(256)) * 4)

    first = eval_batches(corpus, "validation", tokens=640, block_size=16, batch_size=32)
    again = eval_batches(corpus, "validation", tokens=640, block_size=16, batch_size=32)

    assert [len(x) for x, _ in first] == [32, 8]
    assert all(torch.equal(a[0], b[0]) for a, b in zip(first, again, strict=True))
    x, y = first[0]
    assert x[0, 0].item() == 0  # the first window starts at the split's first byte
    assert torch.equal(y[:, :-1], x[:, 1:])


@pytest.mark.parametrize("split, letter", [("validation", b"v"), ("test", b"t")])
def test_the_eval_batches_read_only_the_split_they_are_asked_for(split, letter):
    corpus = corpus_of(b"r" * 2000, validation=b"v" * 300, test=b"t" * 300)

    batches = eval_batches(corpus, split, tokens=256, block_size=16)

    assert {v for x, _ in batches for v in x.flatten().tolist()} == set(letter)


def test_the_train_split_is_no_held_out_split():
    with pytest.raises(ValueError, match="split must be one of validation, test"):
        eval_batches(corpus_of(b"r" * 2000), "train", tokens=256, block_size=16)


def write_large_corpus(folder: Path, files: int, file_bytes: int) -> dict[str, bytes]:
    """`files` text files of `file_bytes` each, every line naming its file."""
    folder.mkdir(parents=True, exist_ok=True)
    contents = {}
    for i in range(files):
        line = f"file {i:03d}: the islands train and the merge goes on.\n".encode()
        body = (line * (file_bytes // len(line) + 1))[:file_bytes]
        (folder / f"part_{i:03d}.txt").write_bytes(body)
        contents[f"part_{i:03d}.txt"] = body
    return contents


def test_a_corpus_larger_than_16_mib_is_used_whole(tmp_path):
    contents = write_large_corpus(tmp_path / "big", files=40, file_bytes=512 * 1024)

    corpus = load_corpus(str(tmp_path / "big"), eval_fraction=0.1, directory=data_dir())

    assert sum(map(len, contents.values())) == 20 * 1024 * 1024
    assert sum(len(b) for b in split_bytes(corpus).values()) == 20 * 1024 * 1024
    last = b"".join(b[-100:] for b in split_bytes(corpus).values())
    assert b"file 039" in last  # the file past the old 16 MiB cut is in


def test_the_prepared_files_are_reused_while_nothing_changes(tmp_path):
    write_files(tmp_path / "texts", 30)
    load_corpus(str(tmp_path / "texts"), eval_fraction=0.3, directory=data_dir())
    folder = prepared_folder(tmp_path / "texts", 0.3, tmp_path / "data")
    built = {p.name: p.stat().st_ino for p in folder.iterdir()}

    load_corpus(str(tmp_path / "texts"), eval_fraction=0.3, directory=data_dir())

    assert {p.name: p.stat().st_ino for p in folder.iterdir()} == built
    assert sorted(built) == [".lock", "manifest.json", "test.bin", "train.bin",
                             "validation.bin"]


def test_the_prepared_folder_changes_with_the_layout(tmp_path, monkeypatch):
    # A folder of format 1 (train and eval) is never opened as three splits.
    now = prepared_folder(tmp_path / "texts", 0.05, tmp_path / "data")
    monkeypatch.setattr(data, "FORMAT", 1)

    assert prepared_folder(tmp_path / "texts", 0.05, tmp_path / "data") != now


@pytest.mark.parametrize("change", ["size", "mtime"])
def test_the_prepared_files_are_rebuilt_when_a_file_changes(tmp_path, change):
    contents = write_files(tmp_path / "texts", 30)
    name = next(n for n in contents if split_of(n, 0.3) == "train")
    before = load_corpus(str(tmp_path / "texts"), eval_fraction=0.3, directory=data_dir())
    train_file = prepared_folder(tmp_path / "texts", 0.3, tmp_path / "data") / "train.bin"
    inode = train_file.stat().st_ino
    path = tmp_path / "texts" / name
    if change == "size":
        path.write_bytes(contents[name] + b"# one more line\n")
    else:
        path.write_bytes(contents[name].replace(b"value", b"VALUE"))
        os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))

    after = load_corpus(str(tmp_path / "texts"), eval_fraction=0.3, directory=data_dir())

    assert train_file.stat().st_ino != inode
    assert bytes(after.train.tolist()) != bytes(before.train.tolist())
    assert path.read_bytes() in bytes(after.train.tolist())
    # The corpus opened before the rebuild still reads the bytes it had.
    assert contents[name] in bytes(before.train.tolist())


def test_a_data_folder_that_is_itself_the_corpus_leaves_its_prepared_files_out(tmp_path):
    write_files(tmp_path, 30)
    first = load_corpus(str(tmp_path), eval_fraction=0.3, directory=tmp_path)

    again = load_corpus(str(tmp_path), eval_fraction=0.3, directory=tmp_path)

    assert split_bytes(again) == split_bytes(first)
    assert b'"fingerprint"' not in b"".join(split_bytes(again).values())


PREPARE_IN_A_PROCESS = """
import hashlib, sys, time
from pathlib import Path
from diloco import data

corpus_path, data_dir, log, me, other = sys.argv[1:]
prepare = data._prepare

def slow_prepare(*args):
    with open(log, "a") as f:
        f.write("built\\n")
    time.sleep(1.0)  # hold the lock long enough for the other process to wait on it
    return prepare(*args)

data._prepare = slow_prepare
Path(me).touch()
while not Path(other).exists():  # start together
    time.sleep(0.01)
corpus = data.load_corpus(corpus_path, 0.1, Path(data_dir))
print(*(hashlib.sha256(getattr(corpus, s).numpy().tobytes()).hexdigest() for s in data.SPLITS))
"""


@pytest.mark.integration
def test_two_processes_preparing_at_once_build_one_correct_file(tmp_path):
    text = tmp_path / "corpus.txt"
    text.write_bytes(b"".join(f"line {i}: one model, many islands.\n".encode()
                              for i in range(50_000)))
    log = tmp_path / "builds.log"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    ready = [tmp_path / "ready-0", tmp_path / "ready-1"]
    processes = [subprocess.Popen(
        [sys.executable, "-c", PREPARE_IN_A_PROCESS, str(text), str(tmp_path / "data"),
         str(log), str(ready[i]), str(ready[1 - i])],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for i in range(2)]
    outputs = [p.communicate(timeout=120) for p in processes]

    assert [p.returncode for p in processes] == [0, 0], [err for _, err in outputs]
    whole = text.read_bytes()
    share = int(len(whole) * 0.1)
    cut = len(whole) - 2 * share
    expected = " ".join(hashlib.sha256(part).hexdigest() for part in (  # train, validation, test
        whole[:cut], whole[cut + share:], whole[cut:cut + share]))
    assert [out.strip() for out, _ in outputs] == [expected, expected]
    assert log.read_text() == "built\n"
    folder = prepared_folder(text, 0.1, tmp_path / "data")
    assert sorted(p.name for p in folder.iterdir()) == [".lock", "manifest.json", "test.bin",
                                                          "train.bin", "validation.bin"]
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["splits"]["train"]["bytes"] == cut


def resident_bytes() -> int:
    fields = Path("/proc/self/status").read_text().split("VmRSS:")[1].split()
    return int(fields[0]) * 1024


def test_opening_a_prepared_corpus_does_not_read_it(tmp_path):
    text = tmp_path / "corpus.txt"
    with open(text, "wb") as f:
        line = b"the islands train and the merge goes on.\n"
        for _ in range(64):
            f.write(line * (1024 * 1024 // len(line)))
    load_corpus(str(text), eval_fraction=0.1, directory=data_dir())  # prepared here
    before = resident_bytes()

    corpus = load_corpus(str(text), eval_fraction=0.1, directory=data_dir())
    sampler = ShardSampler(corpus, 1, 2, block_size=64, seed=0)

    assert resident_bytes() - before < 4 * 1024 * 1024
    assert len(corpus.train) > 51 * 1024 * 1024
    # A batch reads its windows (and what the kernel reads around them), not the shard.
    x, _ = sampler.batch(8)
    assert x.shape == (8, 64) and x.dtype == torch.long


def test_bytes_per_token_is_one_for_the_bytes_tokenizer_and_the_splits_figure_otherwise():
    meta = {"bytes_per_token": {"validation": 3.75, "test": 4}}
    assert bytes_per_token({"format": 2}, "validation") == 1.0
    assert bytes_per_token(meta, "validation") == 3.75
    assert bytes_per_token(meta, "test") == 4.0
    with pytest.raises(ValueError, match="held-out"):
        bytes_per_token(meta, "train")


@pytest.mark.parametrize("bad", [0, -1.0, "3", None, True, float("nan")])
def test_bytes_per_token_refuses_a_figure_that_is_not_a_positive_number(bad):
    with pytest.raises(ValueError, match="bytes_per_token of test"):
        bytes_per_token({"bytes_per_token": {"test": bad}}, "test")


def test_a_corpus_is_known_by_all_its_prepared_files_depend_on(make_config):
    bytes_, trained = make_config().data, make_config(data={"tokenizer": "train"}).data
    wider = make_config(data={"tokenizer": "train", "vocab_size": 300}).data

    assert corpus_key(bytes_) == corpus_key(make_config(data={"vocab_size": 300}).data)
    assert len({corpus_key(bytes_), corpus_key(trained), corpus_key(wider)}) == 3
    assert corpus_key(make_config(data={"text_field": "body"}).data) != corpus_key(bytes_)
