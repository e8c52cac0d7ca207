"""A warm standby island (python -m trainer.standby): what it prepares for a run, and
as a real process on the tests' Redis, it gets ready, then trains only for the run,
island and epoch of its claim.

Every wait polls with a deadline.
"""

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from diloco.data import corpus_key, run_corpus
from diloco.island import gpt_config
from diloco.signing import island_key
from syncd.connection import connect
from syncd.environment import data_dir
from syncd.store import RunStore
from tests.fixtures import wait_until
from trainer.pool import warm_for
from trainer.pool_manager import standby_preexec
from trainer.priority import idle_is_reversible
from trainer.standby import prepare

ROOT = Path(__file__).resolve().parents[2]
TINY_LLAMA = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64,
              "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2,
              "max_position_embeddings": 16}


@pytest.mark.parametrize("model", [{"n_layer": 1, "n_embd": 16, "n_head": 2},
                                   {"source": "hf", "hf_config": json.dumps(TINY_LLAMA)}])
def test_a_standby_warm_for_a_trained_tokenizer_opens_the_runs_corpus_and_model(
        make_config, model):
    config = make_config(model={**model, "block_size": 16},
                         data={"tokenizer": "train", "vocab_size": 300})

    corpora, built = prepare(warm_for({"config": config.to_dict()}))

    # The island takes both as they are (trainer.runner's _corpus, diloco.island.Island).
    corpus = corpora[corpus_key(config.data)]
    assert corpus.folder == run_corpus(config.data, data_dir()).folder
    assert corpus.tokenizer_sha256 != "bytes"
    assert built.config == gpt_config(config)


@pytest.fixture
def standby(tmp_path):
    """A standby process, started as a pool manager starts it (at idle priority, as this
    user may leave it), once it said it is ready."""
    err = open(tmp_path / "standby.err", "wb")  # noqa: SIM115 - closed below
    process = subprocess.Popen([sys.executable, "-m", "trainer.standby"], cwd=ROOT,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                               env={**os.environ, "PYTHONUNBUFFERED": "1"},
                               preexec_fn=standby_preexec(os.getpid(), idle_is_reversible()))
    ready, _, _ = select.select([process.stdout], [], [], 120)
    assert ready and process.stdout.readline().strip() == b"ready"
    yield process
    if process.poll() is None:
        process.kill()
    process.wait()
    err.close()


def active_run(redis_url, run_id, make_config, epoch=1):
    store = RunStore(connect(redis_url), run_id)
    store.put_spec("decoupled", make_config(islands=2).to_dict(), "ab" * 16)
    store.set_epoch("island-0", epoch)
    store.set_epoch("island-1", 1)
    return store


def claim(process, redis_url, log_path, run_id, epoch, island="island-0"):
    message = {"run": run_id, "island": island, "epoch": epoch, "asked_at": time.time(),
               "island_key": island_key(bytes.fromhex("ab" * 16), island, epoch).hex(),
               "claimed_at": time.time(), "redis_url": redis_url, "log_path": str(log_path)}
    process.stdin.write((json.dumps(message) + "\n").encode())
    process.stdin.close()


@pytest.mark.integration
def test_a_stale_claim_from_an_old_epoch_is_refused(standby, redis_url, make_config,
                                                   tmp_path):
    store = active_run(redis_url, 41, make_config, epoch=2)  # a rejoin moved on to 2
    log = tmp_path / "island-0.log"

    claim(standby, redis_url, log, 41, epoch=1)

    assert standby.wait(timeout=60) == 3
    assert store.signals.heartbeats() == {}
    assert "stale claim: epoch 1 of island 'island-0', which is at epoch 2" in log.read_text()


def policies(pid):
    """The scheduling policy of each thread of process `pid`."""
    return {os.sched_getscheduler(int(tid)) for tid in os.listdir(f"/proc/{pid}/task")}


@pytest.mark.integration
def test_a_standby_trains_for_the_run_it_was_claimed_for_and_no_other(
        standby, redis_url, make_config, tmp_path):
    mine = active_run(redis_url, 41, make_config)
    other = active_run(redis_url, 42, make_config)  # same island names, also active
    assert policies(standby.pid) == {os.SCHED_IDLE}  # a refill slows no island

    claim(standby, redis_url, tmp_path / "island-0.log", 41, epoch=1)

    # No syncd publishes version 0 here: it heartbeats "starting" while it waits.
    beat = wait_until(lambda: mine.signals.heartbeats().get("island-0"), 60, "its first heartbeat")
    assert (beat.pid, beat.epoch, beat.warm) == (standby.pid, 1, True)
    assert policies(standby.pid) == {os.SCHED_OTHER}  # an island now: every thread
    assert other.signals.heartbeats() == {}
    assert mine.signals.heartbeats().keys() == {"island-0"}
    standby.send_signal(signal.SIGTERM)
    assert standby.wait(timeout=60) == 0
    assert other.signals.heartbeats() == {}
