"""The web side plugged into syncd: its records in the database, its rejoins through
the run services and its status pushes through the channel layer (syncd/hooks.py),
which `manage.py syncd` hands to syncd when it starts it.
"""

from __future__ import annotations

from syncd.hooks import Hooks
from webapp.runs.live import channel_notifier
from webapp.runs.membership import rejoin_island
from webapp.runs.models import Run
from webapp.runs.records import DatabaseRecorder


def rejoin(run_id: int, island: str) -> None:
    """The next epoch of an island whose chaos kill has ended (no actor)."""
    rejoin_island(Run.objects.get(pk=run_id), island, by=None)


def web_hooks() -> Hooks:
    """The database recorder, the run services' rejoin and the channel layer's pushes."""
    return Hooks(recorder=DatabaseRecorder, rejoin=rejoin, notify=channel_notifier())
