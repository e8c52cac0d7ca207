"""Runs served by a RunSync on the tests' Redis and database, driven tick by tick on a
frozen clock, updates and heartbeats written as islands write them, and the keys a
run store holds: the helpers of syncd's tests (test_service, test_rounds,
test_liveness, test_recovery, test_store and its parts' tests)."""

import time
from typing import Any

import torch

from diloco import codecs
from diloco.protocol import encode_message
from diloco.signing import island_key
from syncd.connection import connect
from syncd.published_server import PublishedServer
from syncd.records import Heartbeat
from syncd.run_keys import RunKeys
from syncd.service import RunSync
from syncd.store import RunStore
from webapp.runs.lifecycle import create_run
from webapp.runs.records import DatabaseRecorder

CONFIG = {
    "model": {"n_layer": 1, "n_embd": 16, "n_head": 2, "block_size": 16},
    "sync": {"inner_steps": 4, "fragments": 2, "overlap_steps": 1, "min_quorum": 2,
             "max_staleness": 1},
    "eval": {"tokens": 256},
    "budget": {"total_tokens": 10**9},
    "islands": [{"name": "a", "region": "us-east", "batch_size": 2},
                {"name": "b", "region": "us-east", "batch_size": 2}],
}
TOKENS_PER_STEP = 2 * 16
# Messages of the chunked store tests (chunk_store): a full fragment of three chunks
# of 1,024 bytes and its momentum.
FULL = b"f" * 3000


def chunk_store(redis_url: str) -> RunStore:
    """Run 7's keys, its messages in chunks of 1,024 bytes."""
    return RunStore(connect(redis_url), 7, chunk_bytes=1024)


def make_run_sync(redis_url: str, tmp_path, mode: str, config: dict | None = None,
                  keepalive=lambda: None, dataplane_url: str | None = None,
                  server: PublishedServer | None = None) -> RunSync:
    """A RunSync of a new run; its tensor messages on `dataplane_url` if given, else on
    the one Redis; its full messages served by `server` if given."""
    run = create_run(name="syncd test", mode=mode, config=config or CONFIG, user=None)
    store = RunStore(connect(redis_url), run.pk,
                     data=connect(dataplane_url) if dataplane_url else None,
                     served=server.serve(str(run.pk)) if server else None)
    store.put_spec(run.mode, run.config, run.secret)
    store.set_epoch("a", 1)
    store.set_epoch("b", 1)
    clock = {"now": 1000.0}
    # Every tick reads everything: the tests step a frozen clock.
    sync = RunSync(store, DatabaseRecorder(run.pk), tmp_path, clock=lambda: clock["now"],
                   control_every_s=0.0, keepalive=keepalive)
    sync.clock_state = clock
    return sync


def send(sync: RunSync, island: str, fragment: int, seq: int, *, epoch: int = 1,
         base_version: int = 0, steps: int = 4, value: float = 0.01, codec: str = "none",
         key: bytes | None = None, shapes: dict | None = None, tokens: int | None = None,
         store: RunStore | None = None) -> None:
    shapes = shapes or sync.rounds.sync.shapes[fragment]
    delta = {n: torch.full(s, value) for n, s in shapes.items()}
    meta = {"run": sync.store.run_id, "island": island, "epoch": epoch, "fragment": fragment,
            "base_version": base_version, "seq": seq,
            "tokens": steps * TOKENS_PER_STEP if tokens is None else tokens,
            "inner_steps": steps, "compute_s": 1.0, "codec": codec}
    blob = encode_message("update", meta, codecs.encode(delta, codec),
                          key or island_key(sync.spec.secret, island, epoch))
    (store or sync.store).updates.push_update(island, epoch, fragment, seq, blob)


def write_beat(sync: RunSync, island: str, **fields: Any) -> None:
    """The island's heartbeat: `fields`' figures, the others 0 or not known yet
    (Heartbeat.bare), as the island writes it."""
    sync.store.signals.heartbeat(island, Heartbeat.bare(**fields))


def heartbeat_all(sync: RunSync) -> None:
    for island in ("a", "b"):
        write_beat(sync, island, epoch=1, time=time.time(), step=4, tokens=128)


def merge_once(sync: RunSync) -> None:
    """Both islands send fragment 0 and syncd merges it (version 1)."""
    heartbeat_all(sync)
    send(sync, "a", 0, 4)
    send(sync, "b", 0, 4)
    sync.tick()
    assert sync.store.globals.versions()[0] == 1


def beat_at(sync: RunSync, island: str, time: float, *, epoch: int = 1,
            state: str = "training", startup_s: float | None = None) -> None:
    write_beat(sync, island, epoch=epoch, time=time, step=4, tokens=128, state=state,
               startup_s=startup_s)


def stored_keys(store: RunKeys, part: str) -> list[str]:
    """The run's keys whose name after the run's prefix starts with `part`."""
    return sorted(k.decode() for k in store.client.scan_iter(match=store.key(part) + "*"))
