"""Island logs: their paths and reading their last lines."""

import pytest

from trainer.island_logs import island_log_path, tail_lines


def test_island_logs_are_per_run_and_island_with_safe_file_names(tmp_path):
    assert island_log_path(tmp_path, 7, "us-east-a") == tmp_path / "run-7" / "us-east-a.log"
    odd = island_log_path(tmp_path, 7, "../../etc/passwd")
    assert odd.parent == tmp_path / "run-7"
    assert "/" not in odd.name and not odd.name.startswith(".")
    assert odd != island_log_path(tmp_path, 7, "__.._etc_passwd")


@pytest.mark.parametrize("lines", [0, 1, 3, 100])
def test_tail_lines_reads_the_last_lines(tmp_path, lines):
    path = tmp_path / "log"
    path.write_text("".join(f"line {i}\n" for i in range(5000)))

    tail = tail_lines(path, lines, block=64)

    assert tail == [f"line {i}" for i in range(5000 - lines, 5000)]


def test_tail_lines_of_a_missing_log_is_empty(tmp_path):
    assert tail_lines(tmp_path / "nope.log") == []
