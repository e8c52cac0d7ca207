"""manage.py pool_manager --region R: a host's warm standby islands (trainer/pool_manager.py)
with the web app's settings, and its alert for an island that crashed on its own.

`--health` exits 0 when a pool manager of this host serves the region (its
announcement in Redis is fresh), 1 otherwise: a container health check.
"""

from __future__ import annotations

import logging
import signal
import socket
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from diloco.sizes import MIB
from syncd.connection import connect
from syncd.pool_store import PoolStore
from trainer.claims import claims_key
from trainer.pool_manager import PoolManager
from webapp.runs.failures import record_island_failure
from webapp.runs.stores import dataplane_url

log = logging.getLogger("archipelago.pool")


class Command(BaseCommand):
    help = "Keep warm standby islands ready on this host for one region."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--region", required=True)
        parser.add_argument("--size", type=int, default=None,
                            help="standbys kept ready; default: the ISLAND_POOL_SIZE setting "
                                 "(auto: as many as the active runs want)")
        parser.add_argument("--health", action="store_true",
                            help="exit 0 if a pool manager of this host serves the region")

    def handle(self, *args: Any, **options: Any) -> None:
        region = options["region"]
        if options["health"]:
            host = f"{socket.gethostname()}:"
            hosts = PoolStore(connect(settings.REDIS_URL)).hosts(region)
            raise SystemExit(0 if any(h.startswith(host) for h in hosts) else 1)
        logging.basicConfig(level=logging.INFO,
                            format="%(asctime)s %(levelname)s %(message)s")
        size = settings.ISLAND_POOL_SIZE if options["size"] is None else options["size"]
        manager = PoolManager(settings.REDIS_URL, region, size, settings.LOG_DIR,
                              memory_bytes=settings.ISLAND_HOST_MEMORY_MB * MIB,
                              on_failure=record_island_failure,
                              claims_key=claims_key(settings.SECRET_KEY),
                              dataplane_url=dataplane_url())

        def stop(signum: int, frame: object) -> None:
            manager.request_stop()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        log.info("pool of %s standby islands for region %s on %s",
                 "auto" if size is None else size, region, manager.host)
        manager.serve_forever()
