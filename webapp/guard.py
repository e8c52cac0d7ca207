"""python -m webapp.guard: stops the processes of a ProcessManager whose process died.

The manager (webapp/processes.py) starts the guard with its first process and
tells it, a line each on the guard's standard input, every process group it
starts ("<pgid> first", or "<pgid> last" for one stopped after the others) and
every one with no process left in it ("<pgid> gone"; a group whose leader ended is
kept while another of its processes runs). When that input ends, the manager is gone:
stopped, or killed, even with SIGKILL, with nothing else left to stop its
processes. The guard then stops every group still running, as the manager's own
stop does, and exits; after a clean stop there is nothing left and it exits at once.
"""

from __future__ import annotations

import sys
from typing import IO

from webapp.processes import stop_groups


def guard(lines: IO[str]) -> int:
    groups: dict[int, str] = {}  # pgid -> "first" or "last", in start order
    for line in lines:
        pgid, word = line.split()
        if word == "gone":
            groups.pop(int(pgid), None)
        else:
            groups[int(pgid)] = word
    stop_groups([g for g, when in groups.items() if when == "first"],
                [g for g, when in groups.items() if when == "last"])
    return 0


if __name__ == "__main__":
    sys.exit(guard(sys.stdin))
