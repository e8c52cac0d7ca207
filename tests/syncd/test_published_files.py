"""syncd's files of each fragment's newest published version (syncd.published_files):
what a merge is durable in when the data plane keeps nothing on disk."""

import torch

from syncd.published_files import PublishedFiles

MOMENTUM = {"momentum.w": torch.arange(6.0).reshape(2, 3), "momentum.b": torch.ones(4)}


def test_a_saved_version_loads_back_whole(tmp_path):
    files = PublishedFiles.of_run(tmp_path, 3)

    written = files.save(1, 7, b"full" * 100, MOMENTUM)

    full, momentum = files.load(1, 7)
    assert full == bytearray(b"full" * 100)
    assert momentum.keys() == MOMENTUM.keys()
    assert all(torch.equal(momentum[k], MOMENTUM[k]) for k in MOMENTUM)
    assert written == (tmp_path / "run-3" / "published" / "1-7.published").stat().st_size
    assert files.load(1, 6) is None and files.load(0, 7) is None


def test_the_momentum_alone_loads_without_reading_the_full_message(tmp_path):
    files = PublishedFiles(tmp_path)
    files.save(0, 1, b"f" * 1000, MOMENTUM)

    full, momentum = files.load(0, 1, full=False)

    assert full is None
    assert torch.equal(momentum["momentum.w"], MOMENTUM["momentum.w"])


def test_a_torn_file_loads_as_none_so_the_run_falls_back_to_its_checkpoint(tmp_path):
    files = PublishedFiles(tmp_path)
    files.save(0, 2, b"f" * 1000, MOMENTUM)
    path = tmp_path / "0-2.published"
    path.write_bytes(path.read_bytes()[:500])

    assert files.load(0, 2) is None


def test_older_versions_go_once_a_newer_one_is_committed_and_all_go_at_the_end(tmp_path):
    files = PublishedFiles(tmp_path / "published")
    for version in (1, 2, 3):
        files.save(0, version, b"f", {})
    files.save(1, 1, b"f", {})

    files.forget_before(0, 3)

    assert sorted(p.name for p in files.folder.iterdir()) == ["0-3.published",
                                                            "1-1.published"]
    files.clear()
    assert not files.folder.exists()
    files.clear()  # nothing left: nothing to do
