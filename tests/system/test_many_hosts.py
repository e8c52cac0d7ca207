"""Archipelago across hosts: every process configured by its environment alone.

Redis wants a password, given in the URL as it would be across a wide-area link;
TLS is a rediss:// URL (and sslmode for PostgreSQL): the first tests check those
URLs reach the clients. The scenario (marked system) runs the hub (Redis, the data
plane, PostgreSQL, syncd serving over HTTPS, the web app) and two regions (a worker and a pool
manager each, and their islands) on hosts of their own, network namespaces joined
by links the kernel shapes (bench/netns.py, bench/hosts.py), each process with a
bare environment joined only by REDIS_URL, DATAPLANE_REDIS_URL and DATABASE_URL; it
kills and rejoins an island, cuts a region's link at the kernel and heals it.

Every wait polls a condition with a deadline; none sleeps and hopes.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys

import dj_database_url
import pytest
import redis
from celery import Celery
from kombu.exceptions import OperationalError

from bench.hosts import Hosts
from bench.netns import Network, Probe, capability_missing, wait_until
from bench.procs import processes
from syncd.connection import connect, redact_url, redis_problem
from syncd.store import RunStore
from tests.certificates import certificates
from tests.webapp.runs.test_runtime_processes import ROOT
from trainer.launch import free_port
from webapp.processes import redis_argv, redis_server_binary, wait_for

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


RATE_MBIT = 40.0  # each region's link, each way: 2 Gb/s scaled down 50 times
ISLANDS = [("east-0", "us-east"), ("east-1", "us-east"), ("west-0", "us-west")]
# What the config claims of each island's link: far faster than the kernel's, so that
# syncd's grace window shows it follows the link the islands measured.
CONFIGURED_GBPS = 100.0


@pytest.fixture(scope="module")
def hosts() -> Hosts:
    """The hub and the regions us-east and us-west in namespaces of their own, syncd
    serving over HTTPS; afterwards nothing of theirs is left."""
    missing = capability_missing()
    if missing:
        pytest.skip(f"{missing}.")
    network = Network(["us-east", "us-west"], RATE_MBIT)
    system = Hosts(network, certificates=certificates, database="postgresql")
    try:
        system.up()
        for region in network.regions:
            system.start_region(region)
        system.ask(_HELPERS)
        yield system
    finally:
        system.down()
    assert network.leftovers() == []
    assert not [p for p in processes() if network.tag in p.cmdline]


_HELPERS = """
def islands(run_id):
    status = store(run_id).status() or {}
    return {n: {"state": i["state"], "epoch": i["epoch"], "link": i["link"]["state"]}
            for n, i in status.get("islands", {}).items()}

def merged_from(run_id, since):
    # Islands whose updates a merge of version above `since` took.
    out = set()
    for f in (store(run_id).status() or {}).get("fragments", []):
        merge = f.get("last_merge") or {}
        if f["version"] > since:
            out |= set(merge.get("weights", {}))
    return sorted(out)

def newest(run_id):
    return min((store(run_id).status() or {}).get("versions") or [0])

def round_trip(run_id):
    status = store(run_id).status() or {}
    return status.get("round_trip_source"), status.get("round_trip_s")
"""


def run_config(corpus: str) -> dict:
    return {
        "model": {"n_layer": 1, "n_embd": 16, "n_head": 2, "block_size": 16},
        "data": {"path": corpus},
        "sync": {"inner_steps": 4, "fragments": 2, "overlap_steps": 1, "min_quorum": 2,
                 "max_staleness": 8},
        "eval": {"tokens": 256}, "liveness": {"heartbeat_timeout_s": 4.0},
        "emulation": {"link": "none"}, "budget": {"total_tokens": 10**9},
        "islands": [{"name": name, "region": region, "batch_size": 2, "speed": 0.5,
                     "bandwidth_gbps": CONFIGURED_GBPS, "latency_ms": 0.0}
                    for name, region in ISLANDS]}


def page_links(hosts: Hosts, viewer: Probe, run_id: int) -> dict[str, str]:
    """Each island's link state on the run page, as a viewer in us-east gets it."""
    page = viewer.ask(f"result = client.get('/runs/{run_id}/')")
    data = json.loads(re.search(r'<script id="page-data" type="application/json">(.*?)</script>',
                                page, re.S).group(1))
    return {i["name"]: i["link"]["state"] for i in data["run"]["islands"]}


@pytest.mark.system
def test_two_regions_across_shaped_links_train_survive_a_kill_and_a_cut_link_and_heal(hosts):
    network = hosts.network
    corpus = network.folder / "corpus.txt"
    corpus.write_text("".join(f"line {i}: islands in two regions, one model.\n"
                              for i in range(4000)))
    hosts.ask("from django.contrib.auth import get_user_model\n"
              "get_user_model().objects.create_user('olga', password='hosts-pw-123')")
    run_id = hosts.ask(f"run = create_run(name='two regions', mode='decoupled', user=None, "
                       f"config={run_config(str(corpus))!r})\n"
                       "start_run(run, by=None)\nresult = run.pk")

    def islands() -> dict:
        return hosts.ask(f"result = islands({run_id})")

    def training(name: str, epoch: int = 1) -> bool:
        island = islands().get(name, {})
        return island.get("state") == "training" and island.get("epoch") == epoch

    wait_until(lambda: all(training(n) for n, _ in ISLANDS), 150,
               "the islands of both regions to train")
    wait_until(lambda: {"east-0", "west-0"} <= set(
        hosts.ask(f"result = merged_from({run_id}, 0)")), 60,
               "a merge of updates from both regions")
    # t_sync is the round trip the islands measured on the 40 Mbit/s links (a
    # fragment's kilobytes: milliseconds each way), not the config's 100 Gb/s (micro-
    # seconds).
    wait_until(lambda: hosts.ask(f"result = round_trip({run_id})")[0] == "measured", 30,
               "syncd to size t_sync from the measured links")
    assert hosts.ask(f"result = round_trip({run_id})")[1] > 0.002
    # The islands read the fragments from syncd's server at SYNCD_SERVE_URL, over HTTPS.
    assert hosts.ask(f"result = sorted({{json.loads(connect(os.environ['REDIS_URL']).get(k))"
                     f"['url'].rsplit(':', 1)[0] for k in connect(os.environ['REDIS_URL'])"
                     f".keys('arch:{run_id}:full:*')}})") == ["https://10.249.0.1"]

    # A kill of one island and its rejoin, in us-east.
    hosts.ask(f"kill_island(Run.objects.get(pk={run_id}), 'east-0', by=None)")
    wait_until(lambda: islands()["east-0"]["state"] == "lost", 30, "east-0 lost")
    hosts.ask(f"rejoin_island(Run.objects.get(pk={run_id}), 'east-0', by=None)")
    wait_until(lambda: training("east-0", 2), 90, "east-0's second epoch to train")

    # us-west's link cut at the kernel: syncd and the page see a partition, us-east trains on.
    viewer = Probe(network, "us-east", hosts.env("viewer", "probe"))
    viewer.ask(_VIEWER.format(base=hosts.web_url))
    # The region reaches the hub's PostgreSQL across its link, with the password only.
    assert viewer.ask(_DATABASE.format(run_id=run_id)) == [
        "postgresql", "10.249.0.1", "two regions", "refused"]
    network.cut("us-west")
    wait_until(lambda: islands()["west-0"]["link"] == "partitioned", 30,
               "syncd to see us-west's island partitioned")
    assert page_links(hosts, viewer, run_id)["west-0"] == "partitioned"
    during = hosts.ask(f"result = newest({run_id})")
    wait_until(lambda: hosts.ask(f"result = newest({run_id})") >= during + 3, 60,
               "us-east's islands to merge on while us-west is cut off")
    assert "west-0" not in hosts.ask(f"result = merged_from({run_id}, {during})")

    # The link back: the island is heard again and its updates merged again.
    network.heal("us-west")
    wait_until(lambda: training("west-0"), 60, "west-0 heard again")
    healed = hosts.ask(f"result = newest({run_id})")
    wait_until(lambda: "west-0" in hosts.ask(f"result = merged_from({run_id}, {healed})"), 60,
               "an update of west-0 merged after the heal")
    assert page_links(hosts, viewer, run_id)["west-0"] == "up"
    viewer.close()
    kinds = hosts.ask(f"result = list(Event.objects.filter(run_id={run_id})"
                      ".values_list('kind', flat=True))")
    assert {"merge", "island_lost", "island_revived", "rejoin"} <= set(kinds)
    hosts.ask(f"stop_run(Run.objects.get(pk={run_id}), by=None)")
    logs = "".join(p.read_text(errors="replace") for p in network.folder.glob("*.log"))
    assert hosts.password not in logs


_DATABASE = """
import os, urllib.parse, django, psycopg
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
django.setup()
from django.db import connection
from webapp.runs.models import Run
name = Run.objects.get(pk={run_id}).name
url = os.environ["DATABASE_URL"]
try:
    psycopg.connect(url.replace(urllib.parse.urlsplit(url).password, "wrong"),
                    connect_timeout=10)
    denied = "let in"
except psycopg.OperationalError:
    denied = "refused"
result = [connection.vendor, connection.settings_dict["HOST"], name, denied]
"""


# The viewer signs in to the web app across its region's link, as a browser would.
_VIEWER = """
import http.cookiejar, re, urllib.parse, urllib.request

class Client:
    def __init__(self, base):
        self.base = base
        self.cookies = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(self.cookies))

    def get(self, path):
        with self.opener.open(self.base + path, timeout=30) as response:
            return response.read().decode()

    def login(self, username, password):
        page = self.get("/accounts/login/")
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
        form = urllib.parse.urlencode({{"username": username, "password": password,
                                       "csrfmiddlewaretoken": token}}).encode()
        self.opener.open(self.base + "/accounts/login/", form, timeout=30)

client = Client("{base}")
client.login("olga", "hosts-pw-123")
"""
