"""The syncd process: every active run served in one loop, status pushed live.

It finds active runs in Redis (arch:runs), keeps one RunSync for each and ticks
them in turn; one broken run is logged and retried, never allowed to stop the
others. Each new status snapshot goes to the channel layer group "run-<id>",
where the control room's websockets listen.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

from syncd.records import Recorder
from syncd.service import RunSync
from syncd.store import RunStore, connect, syncd_command

log = logging.getLogger("archipelago.syncd")


def status_group(run_id: int | str) -> str:
    """The channel layer group that carries a run's live status."""
    return f"run-{run_id}"


def channel_notifier() -> Callable[[str, int, dict], None]:
    """Push status snapshots to the run's channel layer group (Channels, Redis)."""
    from asgiref.sync import async_to_sync
    from channels.layers import get_channel_layer

    group_send = async_to_sync(get_channel_layer().group_send)

    def notify(run_id: str, seq: int, status: dict) -> None:
        try:
            group_send(status_group(run_id), {"type": "run.status", "seq": seq,
                                              "status": status})
        except Exception:  # a full or unreachable channel layer must not stop merging
            log.exception("could not push the status of run %s", run_id)

    return notify


class Syncd:
    """Serves every run in arch:runs; one process, runs ticked in turn.

    Args:
        redis_url: where the runtime's Redis is.
        checkpoint_dir: the folder for checkpoints (one subfolder per run).
        notify: pushes each run's status snapshots (see channel_notifier).
    """

    def __init__(self, redis_url: str, checkpoint_dir: str | Path,
                 notify: Callable[[str, int, dict], None] | None = None):
        self.client = connect(redis_url)
        self.checkpoint_dir = Path(checkpoint_dir)
        self.runs: dict[str, RunSync] = {}
        self.stopping = False
        self.notify = notify

    def tick(self) -> bool:
        if syncd_command(self.client) == "kill":
            log.warning("killed by an admin's fault injection")
            os.kill(os.getpid(), signal.SIGKILL)
        active = set(RunStore.active_runs(self.client))
        for run_id in list(self.runs):
            if run_id not in active:
                del self.runs[run_id]
        busy = False
        for run_id in sorted(active):
            try:
                if run_id not in self.runs:
                    store = RunStore(self.client, run_id)
                    self.runs[run_id] = RunSync(store, Recorder(int(run_id)),
                                                self.checkpoint_dir, notify=self.notify)
                    log.info("serving run %s", run_id)
                busy |= self.runs[run_id].tick()
            except Exception:
                # One broken run must not stop the others; it is retried next tick.
                log.exception("run %s failed a tick", run_id)
                self.runs.pop(run_id, None)
        return busy

    def serve_forever(self, idle_sleep_s: float = 0.02) -> None:
        log.info("syncd serving %s", self.checkpoint_dir)
        while not self.stopping:
            if not self.tick():
                time.sleep(idle_sleep_s)
