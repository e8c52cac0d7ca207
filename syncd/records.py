"""The database rows syncd writes: events, island states, checkpoints, run outcome.

syncd is the only writer of these runtime rows. It collects them while it works
and writes them in batches, so a busy run costs the database a few statements
a second, not one per merge.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from webapp.runs.models import Checkpoint, Event, Island, Run


class Recorder:
    """Batches syncd's writes for one run."""

    def __init__(self, run_id: int):
        self.run_id = int(run_id)
        self.events: list[dict[str, Any]] = []
        self.islands: dict[str, dict[str, Any]] = {}

    def event(self, kind: str, island: str | None = None, **detail: Any) -> None:
        self.events.append({"kind": kind, "island": island, "detail": detail,
                            "time": timezone.now()})

    def island(self, name: str, **fields: Any) -> None:
        self.islands.setdefault(name, {}).update(fields)

    def flush(self) -> None:
        if not self.events and not self.islands:
            return
        with transaction.atomic():
            ids = dict(Island.objects.filter(run_id=self.run_id).values_list("name", "id"))
            Event.objects.bulk_create([
                Event(run_id=self.run_id, island_id=ids.get(e["island"]), kind=e["kind"],
                      time=e["time"], detail=e["detail"]) for e in self.events])
            for name, fields in self.islands.items():
                Island.objects.filter(run_id=self.run_id, name=name).update(**fields)
        self.events.clear()
        self.islands.clear()

    def checkpoint(self, versions: list[int], path: str, sha256: str, nbytes: int,
                   eval_loss: float | None, keep: int) -> list[str]:
        """Record a checkpoint; returns the paths of the ones beyond `keep` to delete."""
        Checkpoint.objects.create(run_id=self.run_id, versions=dict(enumerate(versions)),
                                  outer_step=min(versions), path=path, sha256=sha256,
                                  bytes=nbytes, eval_loss=eval_loss)
        old = list(Checkpoint.objects.filter(run_id=self.run_id)
                   .order_by("-created_at", "-id")[keep:])
        Checkpoint.objects.filter(pk__in=[c.pk for c in old]).delete()
        return [c.path for c in old]

    def checkpoints(self) -> list[tuple[str, str]]:
        """(path, sha256) of this run's checkpoints, newest first."""
        return list(Checkpoint.objects.filter(run_id=self.run_id)
                    .order_by("-created_at", "-id").values_list("path", "sha256"))

    def run_tokens(self, tokens: int) -> None:
        Run.objects.filter(pk=self.run_id).update(tokens=tokens)

    def complete(self) -> None:
        run = Run.objects.get(pk=self.run_id)
        if run.state == Run.State.RUNNING:
            run.transition(Run.State.COMPLETED)
