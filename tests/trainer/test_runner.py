"""The island process (python -m trainer.runner) for real, against the tests' Redis:
syncd's part is played by the test, which publishes the global fragments and marks
updates handled."""

import threading
import time

import pytest
import torch

from diloco.config import RunConfig
from diloco.config_parse import parse_config
from diloco.fragments import partition
from diloco.island import initial_model
from diloco.protocol import decode_message, encode_message
from syncd.store import RunStore, connect
from trainer.launch import island_command
from trainer.supervisor import IslandSupervisor


def two_process_config(text_path: str) -> RunConfig:
    """A tiny run of one island of two processes on the CPU: a fragment due every two
    steps, merged one step after its send."""
    return parse_config({
        "model": {"n_layer": 1, "n_embd": 16, "n_head": 2, "block_size": 16},
        "data": {"path": text_path},
        "sync": {"inner_steps": 4, "fragments": 2, "overlap_steps": 1, "min_quorum": 1},
        "optim": {"inner_lr": 1e-2, "warmup_steps": 20},
        "eval": {"tokens": 256},
        "train": {"device": "cpu"},
        "islands": [{"name": "island-0", "region": "us-east", "batch_size": 4,
                     "processes": 2}],
    }, ["us-east"])


def publish(store, config: RunConfig, secret: bytes, fragment: int, version: int,
            tensors: dict[str, torch.Tensor]) -> None:
    """Publish a global fragment as syncd does."""
    meta = {"run": store.run_id, "fragment": fragment, "version": version,
            "base_version": version, "codec": "none"}
    full = encode_message("global", meta, tensors, secret)
    store.publish(fragment, version, full, None, b"", {}, 0, keep=16)


@pytest.mark.integration
@pytest.mark.parametrize(("end", "ended"), [("done", "exited"), ("stop", "stopped")])
def test_an_island_of_two_processes_trains_mixes_and_stops_under_its_supervisor(
        redis_server, text_path, tmp_path, end, ended):
    """rank 0 talks to Redis, rank 1 follows; a mix goes through, and both end with 0
    when the run is done or the island is stopped."""
    client = connect(redis_server)
    client.flushall()
    store = RunStore(client, 41)
    config = two_process_config(text_path)
    secret = b"two-ranks"
    store.put_spec("decoupled", config.to_dict(), secret.hex())
    store.set_epoch("island-0", 1)
    init = initial_model(config).state_dict()
    fragments = partition({n: t.numel() for n, t in init.items()}, 2)
    for p, f in enumerate(fragments):
        publish(store, config, secret, p, 0, {n: init[n] for n in f.tensor_names})
    sup = IslandSupervisor(island_command(redis_server, 41, "island-0", 1, "cpu"), store,
                           "island-0", 1, tmp_path / "island-0.log", poll_s=0.05, processes=2)
    outcome = {}
    thread = threading.Thread(target=lambda: outcome.update(sup.run()))
    thread.start()
    try:
        first = wait_for(lambda: next((u for u in store.read_updates() if u.fragment == 0),
                                      None))
        # syncd's answer to that update: version 1 of fragment 0, the update handled.
        publish(store, config, secret, 0, 1, {n: init[n] + 0.01 for n in
                                              fragments[0].tensor_names})
        store.mark_handled(0, {"island-0": first.seq})

        def base_version(update) -> int:
            return decode_message(store.update_message(update, 1 << 30), secret)[1]["base_version"]

        mixed = wait_for(lambda: next((u for u in store.read_updates(count=10_000)
                                       if u.fragment == 0 and base_version(u) == 1), None))
        if end == "done":
            store.mark_done()
        else:
            store.send_command("island-0", "stop")
        thread.join(timeout=60)
    finally:
        if thread.is_alive():
            store.send_command("island-0", "kill")
            thread.join(timeout=10)
        client.close()

    log = (tmp_path / "island-0.log").read_text()
    assert (outcome["ended"], outcome["exit_code"]) == (ended, 0), log
    assert mixed.seq > first.seq  # rank 0 mixed version 1 in, and rank 1 went on with it
    assert "rank 1 of 2 on cpu" in log and "Traceback" not in log
    assert "ended with exit code" not in log  # no rank failed, rank 1 included


def wait_for(find, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = find()
        if found is not None:
            return found
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s")
