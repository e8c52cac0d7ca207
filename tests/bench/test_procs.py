"""The machine's processes (bench/procs.py)."""

import os
import sys

from bench.procs import processes


def test_the_process_table_holds_this_process_with_its_parent_group_and_command_line():
    mine = {proc.pid: proc for proc in processes()}[os.getpid()]
    assert mine.ppid == os.getppid()
    assert mine.pgid == os.getpgid(0)
    assert mine.running
    assert mine.cpu_ticks > 0
    assert sys.executable.split("/")[-1].split(".")[0] in mine.cmdline
