"""Live status for the control room: numbered deltas between status snapshots.

syncd stores each status snapshot in Redis under a sequence number (the snapshot a
page gets when it connects) and pushes (through the web side's group_send,
webapp/runs/live.py) to the run's channel layer group only what
changed since the previous one. A delta names the snapshot it applies to (base),
so a page that missed one notices the gap and takes a fresh snapshot instead of
drifting. Lists are replaced whole; dicts are patched key by key.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("archipelago.syncd")

# An op is [path, value] (set path to value) or [path] (delete path); a path is a list
# of dict keys from the top of the status.
Op = list[Any]


def delta(old: dict[str, Any], new: dict[str, Any], path: tuple[str, ...] = ()) -> list[Op]:
    """The ops that turn `old` into `new`."""
    ops: list[Op] = []
    for key, value in new.items():
        if key not in old:
            ops.append([[*path, key], value])
        elif old[key] != value:
            if isinstance(value, dict) and isinstance(old[key], dict):
                ops.extend(delta(old[key], value, (*path, key)))
            else:
                ops.append([[*path, key], value])
    ops.extend([[*path, key]] for key in old if key not in new)
    return ops


def apply(state: dict[str, Any], ops: list[Op]) -> dict[str, Any]:
    """Apply `ops` (from delta) to `state` in place and return it.

    Raises:
        ValueError: when an op is malformed or its path does not lead to a dict.
    """
    for op in ops:
        if not isinstance(op, list) or len(op) not in (1, 2) or not op[0]:
            raise ValueError(f"an op is [path, value] or [path] with a non-empty path, got {op!r}")
        *parents, last = op[0]
        target = state
        for key in parents:
            target = target.setdefault(key, {})
            if not isinstance(target, dict):
                raise ValueError(f"path {op[0]!r} goes through a value that is not an object")
        if len(op) == 2:
            target[last] = op[1]
        else:
            target.pop(last, None)
    return state


def status_group(run_id: int | str) -> str:
    """The channel layer group of a run's live pages: its status and its events."""
    return f"run-{run_id}"


class LiveNotifier:
    """Pushes each run's status to its channel layer group as numbered deltas.

    The first push for a run after syncd starts is the whole status (type
    run.status); every later one is a run.delta from the previous push.

    Args:
        group_send: sends one message to a group (channel layer, made synchronous).
        group_name: the group of a run id.
    """

    def __init__(self, group_send: Callable[[str, dict[str, Any]], None],
                 group_name: Callable[[str], str]):
        self.group_send = group_send
        self.group_name = group_name
        self.last: dict[str, tuple[int, dict[str, Any]]] = {}

    def __call__(self, run_id: str, seq: int, status: dict[str, Any]) -> None:
        previous = self.last.get(run_id)
        if previous is None or previous[0] >= seq:
            message = {"type": "run.status", "seq": seq, "status": status}
        else:
            message = {"type": "run.delta", "seq": seq, "base": previous[0],
                       "ops": delta(previous[1], status)}
        self.last[run_id] = (seq, status)
        try:
            self.group_send(self.group_name(run_id), message)
        except Exception:  # a full or unreachable channel layer must not stop merging
            log.exception("could not push the status of run %s", run_id)
            # The next push must not be a delta from a status no page has seen.
            self.last.pop(run_id, None)
