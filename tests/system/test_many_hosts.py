"""Archipelago across hosts: every process configured by its environment alone.

The web app, syncd and a worker per region run as separate processes, each with
a bare environment of its own (as on separate hosts), joined only by REDIS_URL,
DATAPLANE_REDIS_URL and DATABASE_URL; Redis wants a password, given in the URL as it would be across
a wide-area link. TLS is a rediss:// URL (and sslmode for PostgreSQL); the tests
here check those URLs reach the clients as TLS settings.

Every wait polls a condition with a deadline; none sleeps and hopes.
"""

from __future__ import annotations

import http.cookiejar
import json
import os
import re
import secrets
import subprocess
import sys
import urllib.parse
import urllib.request
from pathlib import Path

import dj_database_url
import pytest
import redis
from celery import Celery
from django.urls import reverse
from kombu.exceptions import OperationalError

from syncd.connection import connect, redact_url, redis_problem
from syncd.store import RunStore
from tests.certificates import certificates
from tests.webapp.runs.test_runtime_processes import (
    ROOT,
    Processes,
    database_url,
    newest_versions,
    wait_until,
)
from trainer.launch import free_port
from webapp.processes import port_accepts, redis_argv, redis_server_binary, wait_for

PASSWORD = "wan-" + secrets.token_hex(8)


@pytest.fixture(scope="module")
def password_redis(tmp_path_factory) -> tuple[str, str]:
    """A Redis that wants a password: (URL with the password, URL without it)."""
    data_dir = tmp_path_factory.mktemp("redis-password")
    port = free_port()
    process = subprocess.Popen(redis_argv(redis_server_binary(), port, data_dir,
                                          appendonly=False, password=PASSWORD),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with_password = f"redis://:{PASSWORD}@127.0.0.1:{port}/0"
    try:
        wait_for(lambda: redis_problem(with_password, timeout_s=1) is None, 10,
                 "the password-protected Redis answering")
        yield with_password, f"redis://127.0.0.1:{port}/0"
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_the_run_store_connects_with_the_password_in_the_url_and_not_without(password_redis):
    with_password, without = password_redis
    store = RunStore(connect(with_password), 41)
    store.put_spec("decoupled", {"seed": 1}, "00")
    assert store.spec()["config"] == {"seed": 1}
    assert redis_problem(with_password) is None

    with pytest.raises(redis.AuthenticationError):
        RunStore(connect(without), 41).spec()
    missing = redis_problem(without)
    assert "wants a password" in missing and "redis://:PASSWORD@HOST:PORT/0" in missing
    wrong = redis_problem(with_password.replace(PASSWORD, "wrong"))
    assert "refused the password" in wrong
    assert PASSWORD not in redact_url(with_password)
    assert "wrong" not in wrong


def test_celery_connects_with_the_password_in_the_url_and_fails_clearly_without(
        password_redis):
    with_password, without = password_redis
    with Celery("hosts", broker=with_password).connection_for_write() as conn:
        conn.ensure_connection(max_retries=1)
        queue = conn.SimpleQueue("region.test-hosts")
        queue.put({"island": "a"})
        assert queue.get(timeout=5).payload == {"island": "a"}
        queue.close()
    with Celery("hosts", broker=without).connection_for_write() as conn, \
            pytest.raises(OperationalError, match="Authentication required"):
        conn.ensure_connection(max_retries=1)


def test_syncd_refuses_to_start_without_the_redis_password_and_says_why(
        password_redis, tmp_path):
    _, without = password_redis
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PYTHONPATH": str(ROOT),
           "REDIS_URL": without, "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}"}
    ran = subprocess.run([sys.executable, "manage.py", "syncd"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert ran.returncode == 2, ran.stderr
    assert "syncd cannot start: the Redis at" in ran.stderr
    assert "wants a password" in ran.stderr


def test_tls_urls_reach_redis_celery_and_postgresql_as_tls_settings():
    url = "rediss://:pw@redis.example:6380/0?ssl_cert_reqs=required&ssl_ca_certs=/ca.pem"
    pool = connect(url).connection_pool
    assert pool.connection_class is redis.SSLConnection
    assert pool.connection_kwargs["ssl_ca_certs"] == "/ca.pem"
    broker = Celery("tls", broker=url).connection_for_write()
    assert broker.transport_cls == "rediss" and broker.ssl["ssl_ca_certs"] == "/ca.pem"
    database = dj_database_url.parse(
        "postgres://arch:pw@db.example:5432/arch?sslmode=verify-full&sslrootcert=/ca.pem")
    assert database["OPTIONS"] == {"sslmode": "verify-full", "sslrootcert": "/ca.pem"}


def host_environment(home: Path, **config: str) -> dict[str, str]:
    """A process's whole environment on a host of its own: the basics and its config."""
    home.mkdir(parents=True, exist_ok=True)
    return {"PATH": os.environ["PATH"], "HOME": str(home), "LANG": "C.UTF-8",
            "PYTHONPATH": str(ROOT), "LOG_DIR": str(home / "logs"), **config}


class WebClient:
    """Signs in to the web app over HTTP (CSRF and all) and fetches its pages."""

    def __init__(self, base: str):
        self.base = base
        self.cookies = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(
            self.cookies))

    def login(self, username: str, password: str) -> None:
        login = reverse("login")
        page = self.get(login)
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
        form = urllib.parse.urlencode({"username": username, "password": password,
                                       "csrfmiddlewaretoken": token}).encode()
        self.opener.open(f"{self.base}{login}", form, timeout=30)
        assert any(c.name == "sessionid" for c in self.cookies), "the sign-in failed"

    def get(self, path: str) -> str:
        with self.opener.open(f"{self.base}{path}", timeout=30) as response:
            assert response.status == 200, (path, response.status)
            return response.read().decode()


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_web_syncd_and_two_region_workers_configured_only_by_environment_train_one_run(
        password_redis, dataplane_url, tmp_path, settings, django_user_model):
    from webapp.celery import app
    from webapp.runs.lifecycle import create_run, start_run, stop_run

    redis_url, _ = password_redis
    connect(redis_url).flushall()
    shared = {"REDIS_URL": redis_url, "DATAPLANE_REDIS_URL": dataplane_url,
              "DATABASE_URL": database_url(),
              "SECRET_KEY": secrets.token_urlsafe(50), "REGIONS": "us-east,us-west"}
    port = free_port()
    # syncd serves the published fragments over HTTPS with a certificate of the tests'
    # authority, which the workers' hosts trust (SSL_CERT_FILE), as islands elsewhere.
    authority, cert, key = certificates(tmp_path / "tls")
    hosts = {
        "web": host_environment(tmp_path / "web-host", **shared),
        "syncd": host_environment(tmp_path / "syncd-host", **shared,
                                  CHECKPOINT_DIR=str(tmp_path / "syncd-host" / "ckpt"),
                                  SYNCD_SERVE_CERT=cert, SYNCD_SERVE_KEY=key),
        "worker-us-east": host_environment(tmp_path / "east-host", **shared,
                                           SSL_CERT_FILE=authority),
        "worker-us-west": host_environment(tmp_path / "west-host", **shared,
                                           SSL_CERT_FILE=authority),
    }
    processes = {name: Processes(env, Path(env["HOME"])) for name, env in hosts.items()}
    processes["web"].start("web", "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
                           "webapp.asgi:application")
    processes["syncd"].start("syncd", "manage.py", "syncd")
    for region in ("us-east", "us-west"):
        processes[f"worker-{region}"].start(
            "worker", "-m", "celery", "-A", "webapp", "worker", "-Q", f"region.{region}",
            "-n", f"{region}@hosts-test", "--concurrency", "1", "--pool", "prefork",
            "--without-gossip", "--without-mingle", "--loglevel", "WARNING")
    # The test creates and starts the run with the run services (what the pages and the
    # API call), which enqueue the islands on the region queues of the same Redis.
    app.conf.broker_url = redis_url
    app._after_fork()  # its pools were made for another broker
    settings.REDIS_URL = redis_url
    try:
        viewer = django_user_model.objects.create_user("olga", password="hosts-pw-123")
        corpus = tmp_path / "corpus.txt"
        corpus.write_text("".join(f"line {i}: islands in two regions, one model.\n"
                                  for i in range(4000)))
        run = create_run(name="two hosts", mode="decoupled", user=viewer, config={
            "model": {"n_layer": 1, "n_embd": 16, "n_head": 2, "block_size": 16},
            "data": {"path": str(corpus)},
            "sync": {"inner_steps": 4, "fragments": 2, "overlap_steps": 1, "min_quorum": 2},
            "eval": {"tokens": 256},
            "budget": {"total_tokens": 10**9},
            "islands": [{"name": "east-0", "region": "us-east", "batch_size": 2},
                        {"name": "west-0", "region": "us-west", "batch_size": 2}]})
        start_run(run, by=None)
        store = RunStore(connect(redis_url), run.pk, data=connect(dataplane_url))
        wait_until(lambda: {n for n, b in store.heartbeats().items()
                            if b.get("state") == "training"} == {"east-0", "west-0"}, 120,
                   "the islands of both regions to train")
        wait_until(lambda: min(newest_versions(store) or [0]) >= 3, 120,
                   "three global versions of every fragment")

        def both_merged() -> bool:
            fragments = (store.status() or {}).get("fragments", [])
            return any({"east-0", "west-0"} <= set((f.get("last_merge") or {})
                                                     .get("weights", {})) for f in fragments)

        wait_until(both_merged, 60, "a merge of updates from both regions")
        # Every host met on the one data plane, and the islands read the fragments from
        # syncd's server over HTTPS: the control Redis holds their references,
        # arch:R:full:<p>, naming it, and the data plane none of their chunks.
        assert not connect(dataplane_url).keys(f"arch:{run.pk}:full:*")
        references = connect(redis_url).keys(f"arch:{run.pk}:full:*")
        assert [k.count(b":") for k in references] == [3, 3]
        assert all(json.loads(connect(redis_url).get(k))["url"].startswith("https://127.0.0.1:")
                   for k in references)
        # The web app, on its own host, serves the run from the shared database.
        wait_until(lambda: port_accepts(port), 60, "the web app to listen")
        web = WebClient(f"http://127.0.0.1:{port}")
        web.login("olga", "hosts-pw-123")
        assert "two hosts" in web.get(reverse("dashboard:run", args=[run.pk]))
        stop_run(run, by=None)
    finally:
        for group in processes.values():
            group.stop_all()
    logs = (tmp_path / "syncd-host" / "syncd.log").read_text()
    assert PASSWORD not in logs
