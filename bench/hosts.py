"""The whole system on the many-hosts network (bench/netns.py): the hub's services and
each region's, every one configured only by the documented environment variables, the
same ones compose.yaml gives its services (`SERVICE_ENVIRONMENT`, checked against
compose.yaml by tests/test_compose.py).

The hub runs the control Redis and the data plane (each wanting the password, on the
hub's address), the database (a SQLite file, or PostgreSQL on the hub's address wanting
the password) and its migration, syncd (serving the published fragments on
the hub's address, SYNCD_SERVE and SYNCD_SERVE_URL) and the web app (Daphne on the
hub's address); each region its Celery worker and its pool manager, whose islands run
in the region's namespace and reach the hub only across the region's shaped link.
A probe in the hub (`Hosts.hub`) runs the caller's code there: it creates, starts and
looks at runs with the run services, as the pages do.
"""

from __future__ import annotations

import secrets
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.netns import (
    HUB_ADDRESS,
    PORTS,
    ROOT,
    Network,
    Probe,
    environment,
    redis_argv,
    wait_until,
)
from bench.postgres import Server

# The variables every process is given, and those of each kind of service beside them,
# as compose.yaml gives them; a region's host may add HOST_TRUST (a private authority's
# certificate). tests/bench/test_hosts.py checks that compose.yaml's services and
# docs/OPERATIONS.md ("Regions on separate hosts") say the same.
SHARED_ENVIRONMENT = ("REDIS_URL", "DATAPLANE_REDIS_URL", "DATABASE_URL", "SECRET_KEY",
                      "REGIONS")
SERVICE_ENVIRONMENT = {
    "syncd": ("SYNCD_SERVE", "SYNCD_SERVE_URL", "SYNCD_SERVE_CERT", "SYNCD_SERVE_KEY",
              "CHECKPOINT_DIR"),
    "web": ("ALLOWED_HOSTS",),
    "worker": (),
    "pool": ("ISLAND_POOL_SIZE",),
    "redis": (), "postgres": (), "migrate": (), "probe": (),
}
HOST_TRUST = ("SSL_CERT_FILE",)


class Hosts:
    """The system's processes on `network`: `up()` starts the hub, `start_region` a
    region's services, `down()` ends them with the network.

    Args:
        network: the namespaces (made by `up`).
        pool_size: ISLAND_POOL_SIZE of the regions' pool managers.
        certificates: with it, syncd serves over HTTPS: called with a folder and the
            hub's address, it makes (an authority's file, a certificate for the address,
            its key), and the regions trust the authority (SSL_CERT_FILE).
        database: "sqlite" (a file of the folder) or "postgresql": a server in the hub,
            on its address, wanting the password (bench/postgres.py; a test
            dependency), which the regions' workers reach across their links.
    """

    def __init__(self, network: Network, pool_size: str = "1",
                 certificates: Callable[[Path, str], tuple[str, str, str]] | None = None,
                 database: str = "sqlite"):
        self.network = network
        self.certificates = certificates
        self.trust: dict[str, str] = {}  # the regions' SSL_CERT_FILE, with certificates
        self.password = secrets.token_hex(12)
        self.pool_size = pool_size
        hub = f"{HUB_ADDRESS}"
        self.shared = {
            "REDIS_URL": f"redis://:{self.password}@{hub}:{PORTS['redis']}/0",
            "DATAPLANE_REDIS_URL": f"redis://:{self.password}@{hub}:{PORTS['dataplane']}/0",
            "DATABASE_URL": (f"postgres://archipelago:{self.password}@{hub}:"
                             f"{PORTS['postgres']}/archipelago" if database == "postgresql"
                             else f"sqlite:///{network.folder / 'db.sqlite3'}"),
            "SECRET_KEY": secrets.token_urlsafe(50),
            "REGIONS": ",".join(network.regions)}
        self.serve_url = f"{'https' if certificates else 'http'}://{hub}:{PORTS['syncd']}"
        self.web_url = f"http://{hub}:{PORTS['web']}"
        self.hub: Probe | None = None

    def env(self, home: str, kind: str, **config: str) -> dict[str, str]:
        """The whole environment of a process of `kind` (SERVICE_ENVIRONMENT) whose
        home is the folder's `home`: the shared variables and its own `config`."""
        unknown = set(config) - set(SERVICE_ENVIRONMENT[kind]) - set(HOST_TRUST)
        if unknown:
            raise ValueError(f"a {kind} is not configured by {sorted(unknown)} "
                             "(bench/hosts.py SERVICE_ENVIRONMENT)")
        return environment(self.network.folder / home, **self.shared, **config)

    def up(self) -> None:
        """The network, then the hub: the Redis pair, the migration, syncd, the web app,
        and the probe, once every one answers."""
        self.network.up()
        folder = self.network.folder
        for name in ("redis", "dataplane"):
            self.network.start(f"hub-{name}", "hub",
                               redis_argv(PORTS[name], folder / name, self.password),
                               self.env("hub", "redis"), binds=(HUB_ADDRESS,))
        if self.shared["DATABASE_URL"].startswith("postgres"):
            self._start_postgres()
        self.hub = Probe(self.network, "hub", self.env("hub-probe", "probe"))
        self.hub.ask(_WAIT_FOR_REDIS)
        migrate = subprocess.run(["ip", "netns", "exec", self.network.hub, sys.executable,
                                  "manage.py", "migrate", "--noinput"], cwd=ROOT,
                                 env=self.env("hub", "migrate"), capture_output=True,
                                 text=True, timeout=300)
        if migrate.returncode:
            raise RuntimeError(f"the migration failed: {migrate.stderr[-2000:]}")
        serving = {"SYNCD_SERVE": f"{HUB_ADDRESS}:{PORTS['syncd']}",
                   "SYNCD_SERVE_URL": self.serve_url,
                   "CHECKPOINT_DIR": str(folder / "syncd" / "checkpoints")}
        if self.certificates is not None:
            authority, cert, key = self.certificates(folder / "tls", HUB_ADDRESS)
            serving |= {"SYNCD_SERVE_CERT": cert, "SYNCD_SERVE_KEY": key}
            self.trust = {"SSL_CERT_FILE": authority}
        self.network.start("hub-syncd", "hub", [sys.executable, "manage.py", "syncd"],
                           self.env("syncd", "syncd", **serving),
                           binds=(HUB_ADDRESS,))
        self.network.start("hub-web", "hub",
                           [sys.executable, "-m", "daphne", "-b", HUB_ADDRESS, "-p",
                            str(PORTS["web"]), "webapp.asgi:application"],
                           self.env("web", "web", ALLOWED_HOSTS=HUB_ADDRESS),
                           binds=(HUB_ADDRESS,))
        self.hub.ask(_SETUP_DJANGO)

    def _start_postgres(self) -> None:
        """PostgreSQL in the hub, on its address only, its database made."""
        url = self.shared["DATABASE_URL"]
        server = Server.make(self.network.folder)
        server.initdb("archipelago", self.password)
        self.network.start("hub-postgres", "hub", server.argv(HUB_ADDRESS, PORTS["postgres"]),
                           self.env("hub-postgres", "postgres"), binds=(HUB_ADDRESS,))
        inside = ("ip", "netns", "exec", self.network.hub)
        wait_until(lambda: server.answers(url, inside), 60, "the hub's PostgreSQL answering")
        server.createdb(url, inside)

    def start_region(self, region: str) -> None:
        """The region's Celery worker and pool manager, in its namespace."""
        self.network.start(f"{region}-worker", region, [
            sys.executable, "-m", "celery", "-A", "webapp", "worker", "-Q", f"region.{region}",
            "-n", f"{region}@{self.network.tag}", "--concurrency", "2", "--pool", "prefork",
            "--without-gossip", "--without-mingle", "--without-heartbeat",
            "--loglevel", "WARNING"],
            self.env(f"{region}-worker", "worker", **self.trust))
        self.network.start(f"{region}-pool", region,
                           [sys.executable, "manage.py", "pool_manager", "--region", region],
                           self.env(f"{region}-pool", "pool",
                                    ISLAND_POOL_SIZE=self.pool_size, **self.trust))

    def ask(self, code: str) -> Any:
        """Run `code` in the hub's probe (Django set up, the run services imported)."""
        assert self.hub is not None, "the hub is not up"
        return self.hub.ask(code)

    def down(self) -> None:
        if self.hub is not None:
            self.hub.close()
            self.hub = None
        self.network.down()


_WAIT_FOR_REDIS = """
import os, time
from syncd.connection import redis_problem
for url in (os.environ["REDIS_URL"], os.environ["DATAPLANE_REDIS_URL"]):
    deadline = time.monotonic() + 30
    while redis_problem(url, timeout_s=1) is not None:
        if time.monotonic() > deadline:
            raise RuntimeError(redis_problem(url, timeout_s=1))
        time.sleep(0.1)
"""

_SETUP_DJANGO = """
import json, os, django
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
django.setup()
from webapp.runs.models import Run, Event, Island
from webapp.runs.lifecycle import create_run, start_run, stop_run
from webapp.runs.faults import kill_island
from webapp.runs.membership import rejoin_island
from syncd.connection import connect
from syncd.store import RunStore

def store(run_id):
    return RunStore(connect(os.environ["REDIS_URL"]), run_id,
                    data=connect(os.environ["DATAPLANE_REDIS_URL"]))
"""
