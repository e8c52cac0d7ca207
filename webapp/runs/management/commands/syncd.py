"""manage.py syncd: the synchronizer service, as `python -m syncd` starts it."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from syncd import server
from webapp.runs.syncd_wiring import web_hooks


class Command(BaseCommand):
    help = "Run syncd: the synchronizer service for its share of the active runs."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--health", action="store_true",
                            help="exit 0 if a syncd on this host is serving, 1 if not")

    def handle(self, *args: Any, **options: Any) -> None:
        from django.conf import settings

        code = server.main(["--health"] if options["health"] else [], web_hooks(),
                           settings.REDIS_URL, settings.CHECKPOINT_DIR,
                           lease_ttl_s=settings.SYNCD_LEASE_TTL_S,
                           threads=settings.SYNCD_THREADS)
        if code:
            raise SystemExit(code)
