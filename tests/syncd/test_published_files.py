"""syncd's files of each fragment's newest published version (syncd.published_files):
what a merge is durable in when the data plane keeps nothing on disk."""

import pytest
import torch

from diloco import tensorfile
from syncd.published_files import PublishedFiles

MOMENTUM = {"momentum.w": torch.arange(6.0).reshape(2, 3), "momentum.b": torch.ones(4)}


def test_a_saved_version_loads_back_whole(tmp_path):
    files = PublishedFiles.of_run(tmp_path, 3)

    written = files.save(1, 7, 5, b"full" * 100, MOMENTUM)

    full, momentum = files.load(1, 7, 5)
    assert full == bytearray(b"full" * 100)
    assert momentum.keys() == MOMENTUM.keys()
    assert all(torch.equal(momentum[k], MOMENTUM[k]) for k in MOMENTUM)
    assert written == (tmp_path / "run-3" / "published" / "1-5-odd.published").stat().st_size
    assert files.load(1, 6, 5) is None and files.load(0, 7, 5) is None
    assert files.load(1, 7, 4) is None  # another grant's file


def test_a_message_saved_in_pieces_loads_back_as_the_message_they_make(tmp_path):
    files = PublishedFiles(tmp_path)
    pieces = [memoryview(b"head"), memoryview(torch.arange(4.0).numpy()), memoryview(b"sig")]

    written = files.save(0, 1, 0, pieces, MOMENTUM)

    full, _ = files.load(0, 1, 0)
    assert full == b"".join(pieces)
    assert written == (tmp_path / "0-0-odd.published").stat().st_size


def test_the_momentum_alone_loads_without_reading_the_full_message(tmp_path):
    files = PublishedFiles(tmp_path)
    files.save(0, 1, 0, b"f" * 1000, MOMENTUM)

    full, momentum = files.load(0, 1, 0, full=False)

    assert full is None
    assert torch.equal(momentum["momentum.w"], MOMENTUM["momentum.w"])


def test_a_torn_file_loads_as_none_so_the_run_falls_back_to_its_checkpoint(tmp_path):
    files = PublishedFiles(tmp_path)
    files.save(0, 2, 0, b"f" * 1000, MOMENTUM)
    path = tmp_path / "0-0-even.published"
    path.write_bytes(path.read_bytes()[:500])

    assert files.load(0, 2, 0) is None


def test_a_version_is_written_over_the_one_two_before_and_the_one_before_stays(tmp_path):
    files = PublishedFiles(tmp_path / "published")
    for version in (1, 2, 3):
        files.save(0, version, 0, bytes([version]) * (10 - version), {})
    files.save(1, 1, 0, b"f", {})

    assert files.load(0, 1, 0) is None  # its file holds 3 now
    assert files.load(0, 2, 0)[0] == bytearray([2] * 8)
    assert files.load(0, 3, 0)[0] == bytearray([3] * 7)  # a shorter one leaves no tail
    assert sorted(p.name for p in files.folder.iterdir()) == [
        "0-0-even.published", "0-0-odd.published", "1-0-odd.published"]
    files.clear()
    assert not files.folder.exists()
    files.clear()  # nothing left: nothing to do


def test_a_save_cut_off_midway_leaves_its_file_unreadable_and_the_version_before_whole(
        tmp_path, monkeypatch):
    files = PublishedFiles(tmp_path)
    files.save(0, 1, 0, b"one" * 100, MOMENTUM)
    files.save(0, 2, 0, b"two" * 100, MOMENTUM)

    def disk_full(f, tensors):
        f.write(b"part of the momentum")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tensorfile, "write_file", disk_full)
    with pytest.raises(OSError):
        files.save(0, 4, 0, b"four" * 100, MOMENTUM)  # over version 2, which is gone now

    assert files.load(0, 2, 0) is None and files.load(0, 4, 0) is None
    full, _ = files.load(0, 1, 0)
    assert full == bytearray(b"one" * 100)


def test_a_grant_that_lost_the_run_never_writes_over_its_successors_file(tmp_path):
    # Grant 2 took the run over and committed version 4; grant 1, not knowing yet,
    # merges a version 4 of its own (the same number, other values).
    files = PublishedFiles(tmp_path)
    files.save(0, 3, 1, b"three by grant 1", MOMENTUM)
    files.save(0, 4, 2, b"four by grant 2", MOMENTUM)

    files.save(0, 4, 1, b"four by grant 1", MOMENTUM)

    assert files.load(0, 4, 2)[0] == bytearray(b"four by grant 2")


def test_once_a_grant_commits_a_fragment_the_other_grants_files_of_it_go(tmp_path):
    files = PublishedFiles(tmp_path)
    files.save(0, 3, 1, b"three", MOMENTUM)
    files.save(0, 4, 1, b"four", MOMENTUM)
    files.save(1, 3, 1, b"other fragment", MOMENTUM)
    files.save(0, 5, 12, b"five", MOMENTUM)

    files.keep_only(0, 12)

    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "0-12-odd.published", "1-1-odd.published"]
    assert files.load(0, 5, 12)[0] == bytearray(b"five")
