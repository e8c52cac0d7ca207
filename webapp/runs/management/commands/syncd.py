"""manage.py syncd: the synchronizer service, as `python -m syncd` starts it."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from webapp.runs.syncd_wiring import main


class Command(BaseCommand):
    help = "Run syncd: the synchronizer service for its share of the active runs."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--health", action="store_true",
                            help="exit 0 if a syncd on this host is serving, 1 if not")

    def handle(self, *args: Any, **options: Any) -> None:
        code = main(["--health"] if options["health"] else [])
        if code:
            raise SystemExit(code)
