"""The runtime for real: a Celery worker, syncd and island processes on a Redis of
the tests' own, driven through the run services, with processes really killed.

Every wait polls a condition with a deadline; none sleeps and hopes.
"""

from __future__ import annotations

import io
import json
import math
import os
import signal
import subprocess
import sys
import time
import zipfile
from itertools import pairwise
from pathlib import Path

import pytest
import torch
from django.db import connection
from django.test import Client

from bench.models import held_out_loss
from diloco.data import run_corpus
from diloco.evaluation import Evaluator
from diloco.island import initial_model
from diloco.tokenizer import Tokenizer
from syncd import checkpoint as checkpoints
from syncd.acl import island_user
from syncd.connection import connect
from syncd.environment import data_dir
from syncd.store import RunStore
from tests.diloco.test_hf import TINY_LLAMA
from tests.fixtures import wait_until
from trainer.island_logs import island_log_path
from trainer.phases import PHASES
from webapp.runs.faults import (
    inject_fault,
    kill_island,
    kill_syncd,
)
from webapp.runs.lifecycle import create_run, start_run, stop_run
from webapp.runs.membership import rejoin_island
from webapp.runs.models import Run

pytestmark = [pytest.mark.integration, pytest.mark.processes,
              pytest.mark.django_db(transaction=True)]
ROOT = Path(__file__).resolve().parents[3]


def database_url() -> str:
    """The test database, for the processes the tests start."""
    s = connection.settings_dict
    if s["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{s['NAME']}"
    auth = s["USER"] + (f":{s['PASSWORD']}" if s["PASSWORD"] else "")
    return f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


class Processes:
    def __init__(self, env: dict[str, str], logs: Path):
        self.env, self.logs = env, logs
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, name: str, *argv: str) -> subprocess.Popen:
        log = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process
        self.procs[name] = subprocess.Popen([sys.executable, *argv], cwd=ROOT, env=self.env,
                                            stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        return self.procs[name]

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@pytest.fixture
def system(redis_url, tmp_path, settings):
    """syncd and a worker for region us-east, on the test Redis and the test database."""
    # The redis_url fixture pointed Celery at the test Redis.
    settings.LOG_DIR = tmp_path / "logs"
    env = {**os.environ, "REDIS_URL": redis_url, "DATABASE_URL": database_url(),
           "CHECKPOINT_DIR": str(tmp_path / "checkpoints"), "LOG_DIR": str(tmp_path / "logs"),
           "DJANGO_SETTINGS_MODULE": "webapp.settings", "PYTHONPATH": str(ROOT)}
    env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    processes = Processes(env, tmp_path)
    processes.start("syncd", "manage.py", "syncd")
    processes.start("worker", "-m", "celery", "-A", "webapp", "worker", "-Q", "region.us-east",
                    "--concurrency", "3", "--pool", "prefork", "-n", "us-east@test",
                    "--without-gossip", "--without-mingle", "--loglevel", "WARNING")
    yield processes
    processes.stop_all()


def tiny_run(corpus_file: Path, total_tokens: int, model: dict | None = None,
             data: dict | None = None) -> Run:
    config = {
        "model": model or {"n_layer": 1, "n_embd": 16, "n_head": 2, "block_size": 16},
        "data": {"path": str(corpus_file), **(data or {})},
        "sync": {"inner_steps": 4, "fragments": 2, "overlap_steps": 1, "min_quorum": 2,
                 "max_staleness": 8},
        "eval": {"tokens": 256},
        "liveness": {"heartbeat_timeout_s": 3.0},
        "checkpoint": {"interval_s": 5.0},
        "budget": {"total_tokens": total_tokens},
        "islands": [{"name": f"island-{i}", "region": "us-east", "batch_size": 2,
                     "speed": 0.5} for i in range(3)],
    }
    return create_run(name="runtime test", mode="decoupled", config=config, user=None)


def wait_all_training(store: RunStore, islands: int = 3) -> None:
    """Faults go to islands that are known to be up, not ones still starting: each
    training, or waiting (at elastic's barrier, say) between its steps."""
    def training() -> bool:
        beats = store.signals.heartbeats()
        return len(beats) == islands and all(b.state in ("training", "waiting")
                                             for b in beats.values())

    wait_until(training, 60, f"all {islands} islands to train")


def newest_versions(store: RunStore) -> list[int]:
    versions = store.globals.versions()
    return [versions[p] for p in sorted(versions)]


def start_and_wait(run: Run, redis_url: str, versions: int) -> RunStore:
    """Start the run and wait until every fragment reached `versions`."""
    store = RunStore(connect(redis_url), run.pk)
    start_run(run, by=None)
    wait_until(lambda: min(newest_versions(store) or [0]) >= versions, 120,
               f"{versions} global versions")
    return store


def test_islands_on_a_real_worker_merge_through_syncd_survive_a_kill_and_rejoin(
        system, corpus_file, redis_url):
    run = tiny_run(corpus_file, total_tokens=10**9)
    store = start_and_wait(run, redis_url, 3)
    wait_all_training(store)
    # Every island trains as its run's Redis user (syncd/acl.py), not the control plane.
    assert sum(c["user"] == island_user(run.pk) for c in store.client.client_list()) >= 3

    kill_island(run, "island-0", by=None)
    wait_until(lambda: (store.status() or {}).get("islands", {}).get("island-0", {})
               .get("state") == "lost", 30, "island-0 to be lost")
    at_loss = sum(newest_versions(store))
    # K = 2 of the 3 islands are alive: the run does not wait for the dead one.
    wait_until(lambda: sum(newest_versions(store)) >= at_loss + 4, 60,
               "versions to advance without island-0")

    rejoin_island(run, "island-0", by=None)
    wait_until(lambda: (b := store.signals.heartbeats().get("island-0")) is not None
               and b.epoch == 2 and b.state == "training", 60,
               "island-0's second epoch to train")

    def merged_again() -> bool:
        fragments = (store.status() or {}).get("fragments", [])
        return any("island-0" in (f.get("last_merge") or {}).get("weights", {})
                   for f in fragments)

    wait_until(merged_again, 60, "an update of the rejoined island-0 to be merged")
    timed = wait_until(lambda: run.events.filter(kind="rejoin", actor=None,
                                                 detail__has_key="seconds_to_first_step").first(),
                       10, "syncd to report the time from the rejoin to the first step")
    assert 0 < timed.detail["seconds_to_first_step"] < 60
    # Where the seconds went, phase by phase (trainer/phases.py), adding up to the whole
    # but the beat's own travel (the marks come from the island, the total from syncd).
    phases = timed.detail["phases"]
    assert sorted(phases) == sorted(PHASES), phases  # a JSON object: PostgreSQL keeps no order
    assert sum(phases.values()) == pytest.approx(timed.detail["seconds_to_first_step"],
                                                 abs=1.0)
    # The first step's CPU seconds on the training thread, at most its wall time.
    assert 0 < timed.detail["first_step_cpu_s"] <= phases["first_step"] + 0.01
    assert timed.detail["warm"] is False  # this system has no pool: a cold start
    stop_run(run, by=None)
    wait_until(lambda: Run.objects.get(pk=run.pk).state == Run.State.STOPPED, 90,
               "the run to be stopped")
    kinds = set(run.events.values_list("kind", flat=True))
    assert {"merge", "island_lost", "rejoin"} <= kinds


def test_a_transformers_llama_trains_merges_and_checkpoints_through_syncd_and_islands(
        system, corpus_file, redis_url):
    model = {"source": "hf", "hf_config": json.dumps(TINY_LLAMA), "block_size": 16}
    run = tiny_run(corpus_file, total_tokens=10**9, model=model)
    store = start_and_wait(run, redis_url, 2)
    wait_all_training(store)
    stop_run(run, by=None)
    wait_until(lambda: Run.objects.get(pk=run.pk).state == Run.State.STOPPED, 90,
               "the run to be stopped")

    newest = run.checkpoints.order_by("-created_at").first()
    params = checkpoints.load(Path(newest.path), newest.sha256)[0]
    init = initial_model(run.run_config()).state_dict()
    assert params.keys() == init.keys()
    assert any(name.startswith("lm.model.layers.1.") for name in params)
    # The islands' merged progress, in every fragment.
    assert all(not torch.equal(params[f"lm.model.layers.{i}.mlp.up_proj.weight"],
                               init[f"lm.model.layers.{i}.mlp.up_proj.weight"]) for i in (0, 1))
    assert all(torch.isfinite(t).all() for t in params.values())


def test_a_llama_on_a_trained_tokenizer_exports_a_folder_transformers_loads_and_scores_alike(
        system, tmp_path, redis_url, django_user_model):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"Document {i}: island {i % 5} trains "
                                          f"the model and merges {i % 11} updates."}) + "\n"
                              for i in range(1500)) + "{not json\n")
    llama = {k: v for k, v in TINY_LLAMA.items() if k != "vocab_size"}
    run = tiny_run(corpus, total_tokens=10**9, data={"tokenizer": "train", "vocab_size": 320},
                   model={"source": "hf", "hf_config": json.dumps(llama), "block_size": 16})
    store = start_and_wait(run, redis_url, 2)
    claimed = store.client.get(store.key("tokenizer")).decode()  # the first island's
    stop_run(run, by=None)
    wait_until(lambda: Run.objects.get(pk=run.pk).state == Run.State.STOPPED, 90,
               "the run to be stopped")
    newest = run.checkpoints.order_by("-created_at").first()
    config = run.run_config()
    prepared = run_corpus(config.data, data_dir())  # as the islands did: the same tokenizer
    carried = checkpoints.load_tokenizer(Path(newest.path), newest.sha256)
    assert carried is not None
    assert Tokenizer(carried).sha256 == prepared.tokenizer_sha256 == claimed
    client = Client()
    client.force_login(django_user_model.objects.create_superuser("root", password=None))

    response = client.get(f"/api/runs/{run.pk}/checkpoints/{newest.pk}/download/hf")

    assert response.status_code == 200, response.content[:500]
    folder = tmp_path / "export"
    zipfile.ZipFile(io.BytesIO(response.content)).extractall(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    assert model.config.vocab_size == 320 and tokenizer.eos_token == "<|endoftext|>"
    # The held-out text, tokenized by transformers document by document, is the split.
    ids = prepared.validation.tolist()
    text = tokenizer.decode(ids)
    again = [i for doc in text.split(tokenizer.eos_token)[:-1]
             for i in (*tokenizer(doc)["input_ids"], tokenizer.eos_token_id)]
    assert again == ids
    evaluator = Evaluator(config, prepared, "validation")
    losses = [model(input_ids=torch.cat([x, y[:, -1:]], 1),
                    labels=torch.cat([x, y[:, -1:]], 1)).loss.item()
              for x, y in evaluator.batches]
    params = checkpoints.load(Path(newest.path), newest.sha256)[0]
    assert sum(losses) / len(losses) == pytest.approx(evaluator(params), abs=1e-4)


def test_in_mode_sync_every_merge_holds_every_island_and_each_waits_for_it(
        system, corpus_file, redis_url, django_user_model, client):
    client.force_login(django_user_model.objects.create_superuser("root", password=None))
    run = tiny_run(corpus_file, total_tokens=10**9)
    run.mode = Run.Mode.SYNC
    run.config["sync"].update(min_quorum=3, overlap_steps=0)
    run.config["islands"][2]["speed"] = 0.2  # without the waits it would fall behind
    run.save(update_fields=["mode", "config"])
    store = start_and_wait(run, redis_url, 1)
    wait_all_training(store)
    since = max(newest_versions(store)) + 1
    # a busy machine: the slow island sets the pace of every merge
    wait_until(lambda: min(newest_versions(store)) >= since + 3, 180, "three more merges each")
    # The merges before the stop: at the stop each island sends its last, shorter period.
    until = newest_versions(store)
    # The API says it per island: every island waits (K = M), so each reads age 0 or 1.
    for island in api_run(client, run)["islands"]:
        ages = island["staleness"]
        assert ages["count"] >= 3 and ages["max"] <= 1 and ages["last"] <= 1, island
    stop_run(run, by=None)
    # syncd writes its events in batches: the last one is written before the run is stopped
    wait_until(lambda: Run.objects.get(pk=run.pk).state == Run.State.STOPPED, 90,
               "the run to be stopped")

    merges = [e.detail for e in run.events.filter(kind="merge")
              if since < e.detail["version"] <= until[e.detail["fragment"]]]
    islands = {"island-0", "island-1", "island-2"}
    assert merges and all(set(m["seqs"]) == islands for m in merges), merges
    # Every island waited for each merge: each update's anchor is at most one version
    # behind the merge it entered (diloco/staleness.py), the slow island's too.
    assert {age for m in merges for age in m["ages"].values()} <= {0, 1}, merges
    # Each island waited for the merge of each update before it trained on: its merged
    # updates of a fragment are H inner steps apart, never two in one round.
    h = run.config["sync"]["inner_steps"]
    for p in range(2):
        for island in islands:
            seqs = sorted(m["seqs"][island] for m in merges if m["fragment"] == p)
            assert all(b - a == h for a, b in pairwise(seqs)), (p, island, seqs)


def test_a_straggler_reads_its_lag_in_the_ages_of_its_merged_updates_in_the_api(
        system, corpus_file, redis_url, django_user_model, client):
    client.force_login(django_user_model.objects.create_superuser("root", password=None))
    run = tiny_run(corpus_file, total_tokens=10**9)
    # The tiny model's step is mostly the loop's own overhead: a straggler must sleep many
    # times its compute to lag, and its updates must not be dropped for their age.
    run.config["islands"][2]["speed"] = 0.015
    run.config["sync"]["max_staleness"] = 64
    run.save(update_fields=["config"])
    start_and_wait(run, redis_url, 1)

    def straggler_merged() -> dict | None:
        islands = {i["name"]: i for i in api_run(client, run)["islands"]}
        return islands if (islands["island-2"]["staleness"] or {}).get("count", 0) >= 3 \
            else None

    # K = 2 of 3: the two fast islands merge without it, so each of its updates enters a
    # merge many versions after its anchor. Theirs are a few versions old too: this tiny
    # model's period is shorter than a round trip through syncd, so the straggler is made
    # slow enough (about 30 times the others) that its lag stands clear of that, under load.
    islands = wait_until(straggler_merged, 180, "three merged updates of the straggler",
                         interval=0.5)
    slow = islands["island-2"]["staleness"]
    fast = [islands[f"island-{i}"]["staleness"] for i in (0, 1)]
    assert slow["p50"] >= 2, (slow, fast)
    assert all(slow["p50"] > ages["p50"] for ages in fast), (slow, fast)
    stop_run(run, by=None)


def test_a_kill_9_of_syncd_loses_no_version_and_the_run_completes(
        system, corpus_file, redis_url, django_user_model, settings):
    admin = django_user_model.objects.create_superuser("root", password=None)
    run = tiny_run(corpus_file, total_tokens=60_000)
    store = start_and_wait(run, redis_url, 2)

    seen: list[list[int]] = []
    kill_syncd(admin)  # the admins' fault: syncd SIGKILLs itself wherever it runs
    assert system.procs["syncd"].wait(timeout=30) == -signal.SIGKILL
    before = newest_versions(store)
    seen.append(before)
    system.start("syncd", "manage.py", "syncd")

    def completed() -> bool:
        versions = newest_versions(store)
        assert all(v >= b for v, b in zip(versions, seen[-1], strict=True)), (seen[-1], versions)
        seen.append(versions)
        run.refresh_from_db()
        return run.state == Run.State.COMPLETED

    wait_until(completed, 180, "the run to complete after the restart")
    assert sum(seen[-1]) > sum(before)
    assert run.checkpoints.exists()
    # Each update is folded and freed as it arrives, so the kill lost the open rounds;
    # the islands sent what was not handled again, and none is merged twice. (A
    # "recovered" merge, whose event died with syncd, names no island: the handled
    # seqs published with it keep its updates from merging again.)
    merged = [(e.detail["fragment"], island, seq) for e in run.events.filter(kind="merge")
              for island, seq in e.detail.get("seqs", {}).items()]
    assert merged and len(merged) == len(set(merged))
    logs = [island_log_path(settings.LOG_DIR, run.pk, f"island-{i}").read_text()
            for i in range(3)]
    assert any("sending update" in log and "again" in log for log in logs)
    for p in range(2):
        for island in ("island-0", "island-1", "island-2"):
            seqs = [seq for fragment, i, seq in merged if (fragment, i) == (p, island)]
            assert seqs == sorted(seqs), (p, island, seqs)


def test_elastic_mode_rolls_back_and_pauses_every_island_when_one_is_lost(
        system, corpus_file, redis_url):
    run = tiny_run(corpus_file, total_tokens=10**9)
    run.mode = Run.Mode.ELASTIC
    # The death report starts the restart as soon as the kill: a pause long enough
    # to be seen on a loaded machine after the waits before it.
    run.config["elastic"] = {"restart_delay_s": 6.0}
    run.save(update_fields=["mode", "config"])
    store = start_and_wait(run, redis_url, 2)
    wait_all_training(store)

    kill_island(run, "island-0", by=None)
    survivors = {"island-1", "island-2"}
    # Its supervisor reports the death: island-0 is lost at once, and the whole job
    # restarts without the survivors waiting at a barrier for a heartbeat timeout.
    (lost,) = wait_until(lambda: island_lost_events(run, "island-0"), 10,
                         "island-0 to be lost")
    assert lost["cause"] == "died"
    wait_until(lambda: store.control.restart()[0] == 1, 30, "a whole-job restart")
    paused = wait_until(lambda: {n for n, b in store.signals.heartbeats().items()
                                 if b.state == "restarting"}, 10,
                        "the survivors to pause for the restart delay")
    assert paused <= survivors
    wait_until(lambda: (store.status() or {}).get("lost_s", {}).get("barrier_wait", 0) > 0,
               10, "the wait at the barrier counted as lost")
    after_restart = sum(newest_versions(store))
    wait_until(lambda: sum(newest_versions(store)) >= after_restart + 2, 60,
               "the survivors to go on after the restart")
    wait_until(lambda: run.events.filter(kind="rollback").exists(), 10, "the rollback event")

    rejoin_island(run, "island-0", by=None)  # membership grows: the job restarts again
    wait_until(lambda: store.control.restart()[0] == 2, 60, "a whole-job restart for the joiner")
    wait_all_training(store)
    after_join = sum(newest_versions(store))
    wait_until(lambda: sum(newest_versions(store)) >= after_join + 6, 60,
               "all three islands to go on after the second restart")
    wait_until(lambda: run.events.filter(kind="rollback", detail__reason="island joined")
               .exists(), 10, "the joiner's rollback event")
    stop_run(run, by=None)


def test_an_island_of_two_processes_follows_an_elastic_restart_and_stops_cleanly(
        system, corpus_file, redis_url, settings):
    run = tiny_run(corpus_file, total_tokens=10**9)
    run.mode = Run.Mode.ELASTIC
    run.config["elastic"] = {"restart_delay_s": 1.0}
    run.config["islands"][0]["processes"] = 2
    run.save(update_fields=["mode", "config"])
    store = start_and_wait(run, redis_url, 2)
    wait_all_training(store)

    kill_island(run, "island-1", by=None)
    wait_until(lambda: store.control.restart()[0] == 1, 30, "a whole-job restart")
    after_restart = sum(newest_versions(store))
    # The barrier waits for island-0: merges after the restart need both its ranks.
    wait_until(lambda: sum(newest_versions(store)) >= after_restart + 4, 60,
               "island-0 and island-2 to go on after the restart")
    stop_run(run, by=None)

    log = island_log_path(settings.LOG_DIR, run.pk, "island-0")
    wait_until(lambda: "epoch 1 ended" in log.read_text(), 30, "island-0 to end")
    text = log.read_text()
    assert "rank 1 of 2" in text
    assert "epoch 1 ended (stopped), exit code 0" in text, text
    alerts = [e.detail.get("message", "") for e in run.events.filter(kind="alert")]
    assert not [m for m in alerts if "crashed" in m], alerts


def runner_processes(run: Run, island: str, epoch: int) -> list[str]:
    """PIDs of island processes of this epoch, found in the process table."""
    pattern = f"trainer.runner .*--run {run.pk} --island {island} --epoch {epoch}$"
    found = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True)
    return found.stdout.split()


def test_a_partitioned_island_is_lost_then_revived_and_a_rejoin_leaves_one_epoch(
        system, corpus_file, redis_url):
    run = tiny_run(corpus_file, total_tokens=10**9)
    store = start_and_wait(run, redis_url, 2)

    def state(island: str) -> str | None:
        return (store.status() or {}).get("islands", {}).get(island, {}).get("state")

    wait_all_training(store)
    inject_fault(run, "island-1", "partition", seconds=6.0, by=None)
    wait_until(lambda: state("island-1") == "lost", 30, "the cut-off island-1 to be lost")
    wait_until(lambda: state("island-1") == "training", 30, "island-1 back when its link is")
    wait_until(lambda: run.events.filter(kind="island_revived", island__name="island-1").exists(),
               10, "the island_revived event")

    assert runner_processes(run, "island-2", 1)  # still running when the rejoin is asked
    rejoin_island(run, "island-2", by=None)
    wait_until(lambda: (b := store.signals.heartbeats().get("island-2")) is not None
               and b.epoch == 2 and b.state == "training", 60,
               "island-2's second epoch to train")
    wait_until(lambda: not runner_processes(run, "island-2", 1), 30,
               "the first epoch of island-2 to be gone")
    assert len(runner_processes(run, "island-2", 2)) == 1
    stop_run(run, by=None)


def island_lost_events(run: Run, island: str) -> list[dict]:
    return list(run.events.filter(kind="island_lost", island__name=island)
                .values_list("detail", flat=True))


def test_a_sigkilled_island_is_lost_before_its_heartbeat_could_have_timed_out(
        system, corpus_file, redis_url):
    run = tiny_run(corpus_file, total_tokens=10**9)
    run.config["liveness"] = {"heartbeat_timeout_s": 60.0}
    run.save(update_fields=["config"])
    store = start_and_wait(run, redis_url, 1)
    wait_all_training(store)

    pid = store.signals.heartbeats()["island-1"].pid
    killed_at = time.monotonic()
    os.kill(pid, signal.SIGKILL)  # from outside: no command, the supervisor sees the exit
    wait_until(lambda: (store.status() or {}).get("islands", {}).get("island-1", {})
               .get("state") == "lost", 30, "island-1 to be lost")
    assert time.monotonic() - killed_at < 30  # half the timeout, on a loaded machine
    (lost,) = wait_until(lambda: island_lost_events(run, "island-1"), 10, "the event")
    assert (lost["cause"], lost["epoch"], lost["signal"]) == ("died", 1, signal.SIGKILL)
    assert store.signals.deaths()["island-1"]["epoch"] == 1
    stop_run(run, by=None)


def test_a_region_outage_is_still_detected_by_the_heartbeat_timeout(
        system, corpus_file, redis_url):
    from webapp.runs.faults import kill_region

    run = tiny_run(corpus_file, total_tokens=10**9)
    store = start_and_wait(run, redis_url, 1)
    wait_all_training(store)

    kill_region(run, "us-east", by=None)
    wait_until(lambda: all(not runner_processes(run, f"island-{i}", 1) for i in range(3)),
               30, "the region's islands to be killed")
    for i in range(3):
        (lost,) = wait_until(lambda i=i: island_lost_events(run, f"island-{i}"), 30,
                             f"island-{i} to be lost")
        assert lost["cause"] == "silent"
        assert lost["silent_s"] >= 3.0  # the run's heartbeat timeout
    assert store.signals.deaths() == {}  # a dark region told no one
    stop_run(run, by=None)


def api_run(client, run: Run) -> dict:
    response = client.get(f"/api/runs/{run.pk}")
    assert response.status_code == 200, response.content
    return response.json()


def test_tokens_and_progress_rise_in_the_api_while_a_run_trains_and_uptime_falls_with_an_outage(
        system, corpus_file, redis_url, django_user_model, client):
    client.force_login(django_user_model.objects.create_superuser("root", password=None))
    run = tiny_run(corpus_file, total_tokens=10**9)
    # A fragment due every 100 steps (about half a second here): with 4, its cadence of
    # a few hundredths of a second is below the scheduling hiccups of two shared cores.
    run.config["sync"]["inner_steps"] = 100
    run.save(update_fields=["config"])
    store = start_and_wait(run, redis_url, 3)
    wait_all_training(store)

    first = wait_until(lambda: (d := api_run(client, run))["outer_steps"] >= 1 and d, 60,
                       "an outer step (every fragment merged) in the API")
    assert first["tokens"] > 0 and first["progress"] > 0
    wait_until(lambda: api_run(client, run)["tokens"] > first["tokens"], 30,
               "the API's tokens to rise")
    later = api_run(client, run)
    assert later["progress"] > first["progress"] and later["state"] == "running"

    # Without a fault the global model advances at its cadence: uptime at least 0.99,
    # once every fragment has merged a few times.
    wait_until(lambda: min((store.status() or {}).get("versions") or [0]) >= 5, 60,
               "five merges of every fragment")
    status = store.status()
    assert status["uptime"] >= 0.99, status
    theta = status["theta_s"]
    assert theta > 0 and status["startup_s"] > 0

    # Two of the three islands cut off for longer than theta: K = 2 is not met, no
    # fragment merges, and that outage is down time.
    for island in ("island-1", "island-2"):
        inject_fault(run, island, "partition", max(4 * theta, 2.0))
    wait_until(lambda: (store.status() or {}).get("uptime", 1.0) < 0.99, 60,
               "uptime to fall during the outage")
    stop_run(run, by=None)


def test_held_out_loss_is_evaluated_live_against_rising_merged_tokens_in_the_api_and_history(
        system, corpus_file, redis_url, django_user_model, client):
    client.force_login(django_user_model.objects.create_superuser("root", password=None))
    run = tiny_run(corpus_file, total_tokens=10**9)
    run.config["eval"]["interval_steps"] = 4  # due at every outer step, at most every 5 s
    run.save(update_fields=["config"])
    start_and_wait(run, redis_url, 1)

    def history() -> list[dict]:
        response = client.get(f"/api/runs/{run.pk}/metrics")
        assert response.status_code == 200, response.content
        return response.json()["metrics"]

    def evaluated() -> list[dict]:
        points = [p for p in history() if p["eval_loss"] is not None]
        return points if len({p["eval_tokens"] for p in points}) >= 2 else []

    # two evaluations of models with more tokens merged, each kept in the run's history
    points = wait_until(evaluated, 120, "two evaluations in the history", interval=0.5)
    assert all(0 < p["eval_tokens"] <= p["tokens"] for p in points), points
    assert points[-1]["eval_tokens"] > points[0]["eval_tokens"]
    # the bytes tokenizer: a byte per token, bits per byte the loss in bits
    assert all(p["eval_bpb"] == pytest.approx(p["eval_loss"] / math.log(2)) for p in points)
    detail = api_run(client, run)
    assert detail["eval_tokens"] >= points[-1]["eval_tokens"]
    assert detail["eval_bpb"] == pytest.approx(detail["eval_loss"] / math.log(2))
    stop_run(run, by=None)


def training_without_periodic_checkpoints(corpus_file: Path, redis_url: str
                                          ) -> tuple[Run, RunStore]:
    """A run started and training whose only checkpoints will be the ones a stop makes."""
    run = tiny_run(corpus_file, total_tokens=10**9)
    run.config["checkpoint"]["interval_s"] = 3600.0
    run.save(update_fields=["config"])
    store = start_and_wait(run, redis_url, 2)
    wait_all_training(store)
    return run, store


def test_a_stop_merges_what_arrived_checkpoints_and_only_then_the_run_is_stopped(
        system, corpus_file, redis_url, django_user_model, client):
    client.force_login(django_user_model.objects.create_superuser("root", password=None))
    run, store = training_without_periodic_checkpoints(corpus_file, redis_url)
    asked = time.time()
    stop_run(run, by=None)
    run.refresh_from_db()
    assert run.state == Run.State.STOPPING
    assert str(run.pk) in RunStore.active_runs(store.client)  # syncd still holds it

    def stopped() -> bool:
        run.refresh_from_db()
        return run.state == Run.State.STOPPED

    wait_until(stopped, 90, "syncd to finish the stop")
    newest = run.checkpoints.order_by("-created_at").first()
    assert newest is not None and newest.created_at.timestamp() > asked
    assert run.events.filter(kind="checkpoint", time__gte=newest.created_at).exists()
    detail = api_run(client, run)
    assert detail["state"] == "stopped"
    assert all(island["state"] != "training" for island in detail["islands"]), detail
    assert detail["tokens"] > 0 and detail["tokens"] == newest_tokens(newest)
    assert str(run.pk) not in RunStore.active_runs(store.client)
    assert "outcome" in store.status()


def test_a_stop_asked_just_before_the_system_stops_is_done_with_its_checkpoint_first(
        system, corpus_file, redis_url):
    run, store = training_without_periodic_checkpoints(corpus_file, redis_url)
    asked = time.time()
    stop_run(run, by=None)
    # The system stops right after, as `python -m webapp.start` does: SIGTERM to syncd
    # and the worker (and so the islands) at once, SIGKILL 7 s later.
    for name in ("syncd", "worker"):
        os.killpg(system.procs[name].pid, signal.SIGTERM)
    system.procs["syncd"].wait(timeout=7)

    run.refresh_from_db()
    assert run.state == Run.State.STOPPED
    newest = run.checkpoints.order_by("-created_at").first()
    assert newest is not None and newest.created_at.timestamp() > asked
    assert run.tokens > 0 and run.tokens == newest_tokens(newest)
    assert str(run.pk) not in RunStore.active_runs(store.client)


def newest_tokens(checkpoint) -> int:
    from syncd import checkpoint as checkpoints

    return checkpoints.load(Path(checkpoint.path), checkpoint.sha256)[3]


def test_through_the_api_a_llama_from_a_config_folder_on_a_trained_bpe_survives_a_kill_and_exports_its_loss(  # noqa: E501
        system, tmp_path, redis_url, django_user_model):
    # The API's start goes to the control queue: its worker starts the islands.
    system.start("control", "-m", "celery", "-A", "webapp", "worker", "-Q", "control",
                 "--concurrency", "1", "--pool", "solo", "-n", "control@test",
                 "--without-gossip", "--without-mingle", "--loglevel", "WARNING")
    client = Client()
    client.force_login(django_user_model.objects.create_superuser("root", password=None))
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"Document {i}: island {i % 5} trains "
                                          f"the model and merges {i % 11} updates."}) + "\n"
                              for i in range(1500)))
    llama = tmp_path / "llama"
    llama.mkdir()
    (llama / "config.json").write_text(json.dumps(
        {**{k: v for k, v in TINY_LLAMA.items() if k != "vocab_size"},
         "architectures": ["LlamaForCausalLM"]}))
    config = tiny_run(corpus, total_tokens=10**9).config
    config["model"] = {"source": "hf", "hf_config": str(llama), "block_size": 16}
    config["data"].update(tokenizer="train", vocab_size=320)
    created = client.post("/api/runs", {"name": "llama", "mode": "decoupled", "config": config},
                          content_type="application/json")
    assert created.status_code == 201, created.content
    run = Run.objects.get(pk=created.json()["id"])
    assert client.post(f"/api/runs/{run.pk}/start").status_code == 202
    store = RunStore(connect(redis_url), run.pk)
    wait_until(lambda: min(newest_versions(store) or [0]) >= 2, 120, "2 global versions")
    wait_all_training(store)

    killed = client.post(f"/api/runs/{run.pk}/islands/island-0/faults", {"kind": "kill"},
                         content_type="application/json")
    assert killed.status_code == 202, killed.content
    wait_until(lambda: api_run(client, run)["islands"][0]["state"] == "lost", 30,
               "island-0 to be lost")
    assert client.post(f"/api/runs/{run.pk}/islands/island-0/rejoin").status_code == 202
    wait_until(lambda: (b := store.signals.heartbeats().get("island-0")) is not None
               and b.epoch == 2 and b.state == "training", 60, "island-0's second epoch")
    assert client.post(f"/api/runs/{run.pk}/stop").status_code in (200, 202)
    wait_until(lambda: api_run(client, run)["state"] == "stopped", 90, "the run to be stopped")

    shown = api_run(client, run)["eval_loss"]  # the final model's, evaluated by syncd
    newest = client.get(f"/api/runs/{run.pk}/checkpoints").json()["checkpoints"][-1]  # the final
    response = client.get(f"/api/runs/{run.pk}/checkpoints/{newest['id']}/download/hf")
    assert response.status_code == 200, response.content[:500]
    folder = tmp_path / "export"
    zipfile.ZipFile(io.BytesIO(response.content)).extractall(folder)
    prepared = Path(run_corpus(run.run_config().data, data_dir()).folder)
    loss = held_out_loss(folder, prepared, 256, 16)  # transformers alone, as the README says
    assert loss == pytest.approx(shown, abs=1e-4)
    # Bits per byte: over the bytes of the same split's text, as transformers decodes it.
    from transformers import AutoTokenizer

    ids = run_corpus(run.run_config().data, data_dir()).validation.tolist()
    text = AutoTokenizer.from_pretrained(folder).decode(ids, skip_special_tokens=True)
    assert api_run(client, run)["eval_bpb"] == pytest.approx(
        shown / math.log(2) / (len(text.encode()) / len(ids)), rel=1e-6)
