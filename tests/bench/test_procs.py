"""The machine's processes from /proc (bench/procs.py)."""

import os
import sys

from bench.procs import processes


def test_the_process_table_holds_this_process_with_its_parent_and_command_line():
    mine = {pid: (fields, cmdline) for pid, fields, cmdline in processes()}[os.getpid()]
    fields, cmdline = mine
    assert int(fields[1]) == os.getppid()
    assert sys.executable.split("/")[-1].split(".")[0] in cmdline
