"""syncd and its Redis in processes of their own, for the benchmarks of the data plane
(bench/dataplane.py, bench/utilization.py): a `syncd.service.RunSync` of one run,
ticked in a loop as `syncd.server.Syncd` ticks it (the same ingest, check, merge and
publish code), without the lease and the web side's database (an in-memory
recorder); and what the benchmarks read of a process (psutil).
"""

from __future__ import annotations

import resource
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil
import torch

from syncd.connection import connect
from syncd.store import RunStore
from trainer.launch import free_port
from webapp.processes import start_scratch_redis

RUN_ID = "1"


class BenchRecorder:
    """The run's rows, kept in memory: syncd's merge events are all the bench reads."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.merges: list[dict[str, Any]] = []

    def event(self, kind: str, island: str | None = None, **detail: Any) -> None:
        if kind == "merge":  # accounted once published: `at` is when it was
            self.merges.append({**detail, "at": time.time()})

    def island(self, name: str, **fields: Any) -> None:
        pass

    def metric(self, status: dict[str, Any], now: float) -> None:
        pass

    def progress(self, tokens: int, outer_steps: int, progress: float) -> None:
        pass

    def flush(self) -> None:
        pass

    def checkpoint(self, versions: list[int], path: str, sha256: str, nbytes: int,
                   eval_loss: float | None, keep: int) -> list[str]:
        return []

    def checkpoint_evaluated(self, path: str, eval_loss: float) -> None:
        pass

    def checkpoints(self) -> list[tuple[str, str]]:
        return []

    def recover_merges(self, versions: dict[int, int], tokens: dict[int, int]) -> list[int]:
        return []

    def end(self, state: str) -> None:
        pass


def rss_of() -> tuple[int, int]:
    """(resident memory now, its peak) of this process in bytes."""
    return (psutil.Process().memory_info().rss,
            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)


def cpu_seconds(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def disk_written(pid: int) -> int:
    """Bytes the process (and the children it reaped: Redis's rewrites) sent to storage."""
    return psutil.Process(pid).io_counters().write_bytes


def syncd_main(url: str, data_url: str, checkpoint_dir: str, stop: Any, busy_s: Any,
               out: Any, served: bool = True) -> None:
    """syncd's process: one RunSync ticked until `stop`, as syncd.server ticks it and as
    `manage.py syncd` runs by default: torch on one thread (SYNCD_THREADS), large frees
    returned to the system, published fragments served from its files on loopback
    (SYNCD_SERVE; with `served` False, on the data plane). `busy_s` adds up the wall
    seconds of the passes that had work."""
    from syncd.malloc import return_large_frees
    from syncd.published_server import PublishedServer
    from syncd.server import wait_for_updates
    from syncd.service import RunSync

    torch.set_num_threads(1)
    return_large_frees()

    idle_rss = rss_of()[0]
    recorder = BenchRecorder()
    server = PublishedServer(checkpoint_dir) if served else None
    sync = RunSync(RunStore(connect(url), RUN_ID, data=connect(data_url),
                            served=server.serve(RUN_ID) if server else None), recorder,
                   Path(checkpoint_dir))
    while not stop.is_set():
        started = time.perf_counter()
        if sync.tick():
            busy_s.value += time.perf_counter() - started
        else:  # as syncd.server waits for work
            wait_for_updates(sync.store.client, [sync])
    out.put({"idle_rss": idle_rss, "peak_rss": rss_of()[1], "merges": recorder.merges,
             "bytes_saved": sync.rounds.publisher.bytes_saved})


def start_redis(folder: Path, appendonly: bool = False) -> tuple[subprocess.Popen, str]:
    folder.mkdir(parents=True, exist_ok=True)
    return start_scratch_redis(folder, free_port(), appendonly=appendonly)
