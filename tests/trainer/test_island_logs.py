"""Island logs: their paths and reading their last lines."""

import time

import pytest

from trainer.island_logs import CUT, MAX_LINE_BYTES, island_log_path, tail_lines


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


def test_a_line_without_end_is_read_in_linear_time_and_cut_to_its_end(tmp_path):
    """An island printing without a newline makes one huge line: its supervisor reads
    no more than a page's worth of it, once, and ships its end, marked."""
    path = tmp_path / "log"
    with open(path, "wb") as f:
        f.write(b"before\n")
        for _ in range(64):
            f.write(b"x" * (1 << 20))
        f.write(b"the end")

    started = time.monotonic()
    tail = tail_lines(path, 50, block=64)

    assert time.monotonic() - started < 2.0
    [line] = tail
    assert line.startswith(CUT) and line.endswith("the end")
    assert len(line.encode()) <= MAX_LINE_BYTES + len(CUT.encode())


def test_long_lines_among_short_ones_are_cut_and_the_short_kept(tmp_path):
    path = tmp_path / "log"
    path.write_text("a\n" + "y" * 5000 + "\nb\n")

    assert tail_lines(path, 3) == ["a", CUT + "y" * MAX_LINE_BYTES, "b"]
