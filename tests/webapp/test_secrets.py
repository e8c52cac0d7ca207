"""The Redis password never reaches a page, a log, an event or `ps`: an island started
by its supervisor against a password-protected Redis, crashing at once, leaves its
command line in /proc, its log file, the log lines shipped to Redis, a crash alert
and the API's answers, and none of them holds the password."""

from __future__ import annotations

import json
import secrets
import subprocess
import threading
from pathlib import Path

import pytest
import redis

from diloco.signing import island_key
from syncd.connection import connect
from syncd.store import RunStore
from trainer.launch import free_port
from trainer.supervisor import supervise_island
from webapp.processes import redis_argv, redis_server_binary, wait_for
from webapp.runs.failures import record_island_failure
from webapp.runs.lifecycle import create_run
from webapp.runs.models import Event

pytestmark = [pytest.mark.integration, pytest.mark.django_db]

ISLAND = "island-with-a-secret"
CONFIG = {"model": {"n_layer": 1, "n_embd": 16, "n_head": 2, "block_size": 16},
          "sync": {"inner_steps": 4, "fragments": 1, "min_quorum": 1},
          "islands": [{"name": ISLAND, "region": "us-east"}]}


@pytest.fixture
def password_redis(tmp_path):
    """A Redis that wants a password, and its URL."""
    password = "pw-" + secrets.token_hex(12)
    port = free_port()
    (tmp_path / "redis").mkdir()
    process = subprocess.Popen(redis_argv(redis_server_binary(), port, tmp_path / "redis",
                                          appendonly=False, password=password),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://:{password}@127.0.0.1:{port}/0"
    try:
        wait_for(lambda: answers(url), 20, "the password-protected Redis")
        yield url, password
    finally:
        process.terminate()
        process.wait(10)


def answers(url: str) -> bool:
    try:
        return bool(connect(url).ping())
    except redis.ConnectionError:
        return False


def island_cmdlines(seen: list[str], environs: list[str], done: threading.Event) -> None:
    """Every command line of an island process of ISLAND, as `ps` shows it, and the
    environment it was started with."""
    while not done.is_set():
        for proc in Path("/proc").iterdir():
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                environ = (proc / "environ").read_bytes().replace(b"\0", b" ").decode()
            except (OSError, ValueError):
                continue
            if "trainer.runner" in cmdline and ISLAND in cmdline and cmdline not in seen:
                seen.append(cmdline)
                environs.append(environ)
        done.wait(0.05)


def supervise_crashing_island(run, url: str, log_dir: Path
                              ) -> tuple[RunStore, dict, list[str], list[str]]:
    """Epoch 1 of ISLAND of `run`, under its supervisor against the Redis at `url`, with a
    config the island cannot build (it crashes once it has read the spec), watched from
    /proc: (the run's store, the supervisor's result, the island's command lines and
    their environments)."""
    store = RunStore(connect(url), run.pk)
    store.put_spec(run.mode, {**run.config, "model": {"n_layer": "one"}}, run.secret)
    store.set_epoch(ISLAND, 1)
    seen: list[str] = []
    environs: list[str] = []
    done = threading.Event()
    watcher = threading.Thread(target=island_cmdlines, args=(seen, environs, done))
    watcher.start()
    try:
        result = supervise_island(run.pk, ISLAND, 1, url, epoch_key(run), log_dir)
    finally:
        done.set()
        watcher.join()
    return store, result, seen, environs


def test_the_redis_password_is_in_no_command_line_log_event_or_api_answer(
        password_redis, tmp_path, settings, operator_client):
    url, password = password_redis
    settings.REDIS_URL = url
    settings.LOG_DIR = tmp_path / "logs"
    run = create_run(name="secret", mode="decoupled", config=CONFIG, user=None)
    store, result, seen, _ = supervise_crashing_island(run, url, settings.LOG_DIR)
    record_island_failure(run.pk, ISLAND, result)

    assert result["ended"] == "failed"
    assert seen, "the island's process was seen"
    log_file = next(settings.LOG_DIR.rglob("*.log")).read_text()
    assert "start epoch 1" in log_file
    events = [json.dumps(e.detail) for e in Event.objects.filter(run=run)]
    assert any("crashed" in e for e in events)
    answers = [operator_client.get(f"/api/runs/{run.pk}/islands/{ISLAND}/log?lines=1000"),
               operator_client.get(f"/api/runs/{run.pk}/events"),
               operator_client.get(f"/api/runs/{run.pk}")]
    assert all(a.status_code == 200 for a in answers)
    for text in [*seen, log_file, *store.signals.log(ISLAND), json.dumps(result), *events,
                 *(a.content.decode() for a in answers)]:
        assert password not in text


def epoch_key(run) -> str:
    """The key its launcher gives epoch 1 of ISLAND."""
    return island_key(bytes.fromhex(run.secret), ISLAND, 1).hex()


def test_an_island_process_holds_its_own_key_and_never_the_runs_secret(
        password_redis, tmp_path, settings, monkeypatch):
    """Neither its command line nor its environment carries the run's secret, nor the
    control plane's credentials its worker has (the database's, which hold every run's
    secret, and SECRET_KEY); its environment carries its own epoch's key."""
    url, _ = password_redis
    worker_secrets = {"SECRET_KEY": "worker-" + secrets.token_hex(16),
                      "DATABASE_URL": f"postgres://u:{secrets.token_hex(8)}@db/archipelago"}
    for name, value in worker_secrets.items():
        monkeypatch.setenv(name, value)
    settings.LOG_DIR = tmp_path / "logs"
    run = create_run(name="keys", mode="decoupled", config=CONFIG, user=None)
    store, _, seen, environs = supervise_crashing_island(run, url, settings.LOG_DIR)
    key = epoch_key(run)

    assert seen and environs, "the island's process was seen"
    assert all(f"ARCHIPELAGO_ISLAND_KEY={key}" in e for e in environs)
    for text in [*seen, *environs]:
        assert run.secret not in text
        assert run.secret.upper() not in text
        assert all(value not in text for value in worker_secrets.values())
    assert all(key not in s for s in seen)
    assert "secret" not in store.spec()
