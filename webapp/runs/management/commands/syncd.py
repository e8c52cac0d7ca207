"""manage.py syncd: the synchronizer service for its share of the active runs.

It finds active runs in Redis (arch:runs), takes a lease on its share of them
(start several, on one host or many, to split the runs: syncd/lease.py), keeps
one RunSync for each run it holds, and ticks them in turn. This command is
syncd's composition root, as `manage.py pool_manager` is the pool's: syncd knows
the web side only through syncd/hooks.py, and the command plugs in its records,
rejoins and status pushes (webapp/runs/syncd_wiring.py) with the Django settings
REDIS_URL, DATAPLANE_REDIS_URL, CHECKPOINT_DIR, SYNCD_LEASE_TTL_S, SYNCD_THREADS,
SYNCD_SERVE, SYNCD_SERVE_URL, SYNCD_SERVE_CERT and SYNCD_SERVE_KEY. It exits at once
with a sentence saying what is wrong when a Redis cannot be reached or wants a
password, or syncd cannot serve published fragments where SYNCD_SERVE says (or with
the certificate and key SYNCD_SERVE_CERT and SYNCD_SERVE_KEY name).

`--health` exits 0 when a syncd on this host is serving (its announcement in
Redis is current), 1 otherwise: a container health check.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from syncd import server
from webapp.runs.stores import dataplane_url
from webapp.runs.syncd_wiring import web_hooks


class Command(BaseCommand):
    help = "Run syncd: the synchronizer service for its share of the active runs."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--health", action="store_true",
                            help="exit 0 if a syncd on this host is serving, 1 if not")

    def handle(self, *args: Any, **options: Any) -> None:
        code = server.main(web_hooks(), settings.REDIS_URL, settings.CHECKPOINT_DIR,
                           health=options["health"], lease_ttl_s=settings.SYNCD_LEASE_TTL_S,
                           threads=settings.SYNCD_THREADS,
                           eval_cpu_share=settings.SYNCD_EVAL_CPU_SHARE,
                           dataplane_url=dataplane_url(), serve=settings.SYNCD_SERVE,
                           serve_url=settings.SYNCD_SERVE_URL,
                           serve_tls=(settings.SYNCD_SERVE_CERT, settings.SYNCD_SERVE_KEY)
                           if settings.SYNCD_SERVE_CERT else None)
        if code:
            raise SystemExit(code)
