"""The web side plugged into syncd: its records in the database, its rejoins through
the run services and its status pushes through the channel layer (syncd/hooks.py).

`python -m syncd` and `manage.py syncd` both start syncd through main().
"""

from __future__ import annotations

import os

from syncd.hooks import Hooks


def rejoin(run_id: int, island: str) -> None:
    """The next epoch of an island whose chaos kill has ended (no actor)."""
    from webapp.runs.models import Run
    from webapp.runs.services import rejoin_island

    rejoin_island(Run.objects.get(pk=run_id), island, by=None)


def web_hooks() -> Hooks:
    """The database recorder, the run services' rejoin and the channel layer's pushes."""
    from webapp.runs.live import channel_notifier
    from webapp.runs.records import DatabaseRecorder

    return Hooks(recorder=DatabaseRecorder, rejoin=rejoin, notify=channel_notifier())


def main(argv: list[str] | None = None) -> int:
    """syncd with the web side plugged in, configured from the Django settings
    (REDIS_URL, CHECKPOINT_DIR, SYNCD_LEASE_TTL_S, SYNCD_THREADS, SYNCD_EVAL_CPU_SHARE)."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
    import django

    django.setup()
    from django.conf import settings

    from syncd import server

    return server.main(argv, web_hooks(), settings.REDIS_URL, settings.CHECKPOINT_DIR,
                       lease_ttl_s=settings.SYNCD_LEASE_TTL_S, threads=settings.SYNCD_THREADS,
                       eval_cpu_share=settings.SYNCD_EVAL_CPU_SHARE)
