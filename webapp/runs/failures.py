"""Alerts for islands that fail on their own: a crash is not a fault anyone injected."""

from __future__ import annotations

from typing import Any

from webapp.runs.models import Event, Island


def record_island_failure(run_id: int, island: str, result: dict[str, Any]) -> None:
    """An island process died on its own: an alert with its exit code and last log lines,
    so the control room can say why. A rejoin starts it again."""
    row = Island.objects.filter(run_id=run_id, name=island).first()
    Event.objects.create(run_id=run_id, island=row, kind=Event.Kind.ALERT,
                         detail={"message": f"island {island} epoch {result['epoch']} crashed "
                                            f"with exit code {result['exit_code']}",
                                 "log": result.get("log_tail", [])})
