"""The database rows syncd writes: events, island states, checkpoints, run outcome
(syncd.hooks.Recorder, plugged into syncd by webapp/runs/syncd_wiring.py).

syncd is the only writer of these runtime rows. It collects them while it works
and writes them in batches, so a busy run costs the database a few statements
a second, not one per merge.
"""

from __future__ import annotations

import time
from typing import Any

from django.db import transaction
from django.db.models import BigIntegerField, Max, Sum
from django.db.models.fields.json import KT
from django.db.models.functions import Cast
from django.utils import timezone

from webapp.runs.history import THIN_EVERY_S, thin_metrics
from webapp.runs.live import RUNS_GROUP, push_events, send_to_group
from webapp.runs.models import TRANSITIONS, Checkpoint, Event, Island, Metric, Run

METRIC_EVERY_S = 2.0


class DatabaseRecorder:
    """Batches syncd's writes for one run (syncd.hooks.Recorder)."""

    def __init__(self, run_id: int, metric_every_s: float = METRIC_EVERY_S):
        self.run_id = int(run_id)
        self.events: list[dict[str, Any]] = []
        self.islands: dict[str, dict[str, Any]] = {}
        self.metrics: list[Metric] = []
        self.run_progress: dict[str, Any] = {}  # the Run row's live figures, not yet written
        self.metric_every_s = metric_every_s
        self.next_metric = 0.0
        self.next_thinning = time.monotonic() + THIN_EVERY_S

    def event(self, kind: str, island: str | None = None, **detail: Any) -> None:
        self.events.append({"kind": kind, "island": island, "detail": detail,
                            "time": timezone.now()})

    def island(self, name: str, **fields: Any) -> None:
        self.islands.setdefault(name, {}).update(fields)

    def metric(self, status: dict[str, Any], now: float) -> None:
        """Keep a point of the run's history from a status snapshot, one per
        metric_every_s of syncd's clock `now`."""
        if now < self.next_metric:
            return
        self.next_metric = now + self.metric_every_s
        islands = {name: {key: island.get(key) for key in
                          ("state", "fault", "tokens", "tokens_per_s", "bytes_up", "bytes_down",
                           "emulated_bytes_up", "emulated_bytes_down", "goodput")}
                   for name, island in status.get("islands", {}).items()}
        self.metrics.append(Metric(
            run_id=self.run_id, time=timezone.now(), tokens=status.get("tokens_merged", 0),
            outer_steps=status.get("outer_steps", 0), versions=status.get("versions", []),
            goodput=status.get("goodput"), uptime=status.get("uptime"),
            train_loss=status.get("train_loss"), eval_loss=status.get("eval_loss"),
            eval_tokens=status.get("eval_tokens"), eval_bpb=status.get("eval_bpb"),
            alive_islands=status.get("alive_islands", 0), islands=islands))

    def progress(self, tokens: int, outer_steps: int, progress: float) -> None:
        """The run's tokens merged, outer steps and progress (tokens / budget) now; the
        Run row takes them at the next flush, and the runs list hears of them."""
        self.run_progress = {"tokens": int(tokens), "outer_steps": int(outer_steps),
                             "progress": float(progress)}

    def flush(self) -> None:
        """Write what was recorded since the last flush; every THIN_EVERY_S, thin the
        run's older history too (webapp/runs/history.py)."""
        if time.monotonic() >= self.next_thinning:
            self.next_thinning = time.monotonic() + THIN_EVERY_S
            thin_metrics(self.run_id, timezone.now())
        if not self.events and not self.islands and not self.metrics and not self.run_progress:
            return
        progress = self.run_progress
        with transaction.atomic():
            if progress:
                Run.objects.filter(pk=self.run_id).update(
                    tokens=progress["tokens"], outer_steps=progress["outer_steps"])
            ids = dict(Island.objects.filter(run_id=self.run_id).values_list("name", "id"))
            events = Event.objects.bulk_create([
                Event(run_id=self.run_id, island_id=ids.get(e["island"]), kind=e["kind"],
                      time=e["time"], detail=e["detail"]) for e in self.events])
            for name, fields in self.islands.items():
                Island.objects.filter(run_id=self.run_id, name=name).update(**fields)
            Metric.objects.bulk_create(self.metrics)
        self.events.clear()
        self.islands.clear()
        self.metrics.clear()
        self.run_progress = {}
        push_events(self.run_id, events)
        if progress:
            send_to_group(RUNS_GROUP, {"type": "runs.progress", "run": self.run_id, **progress})

    def checkpoint(self, versions: list[int], path: str, sha256: str, nbytes: int,
                   eval_loss: float | None, keep: int) -> list[str]:
        """Record a checkpoint; returns the paths of the ones beyond `keep` to delete.

        A checkpoint another run was created from is never rotated out: that run (a
        draft, or one training) starts from it."""
        Checkpoint.objects.create(run_id=self.run_id, versions=dict(enumerate(versions)),
                                  outer_step=min(versions), path=path, sha256=sha256,
                                  bytes=nbytes, eval_loss=eval_loss)
        old = [c for c in Checkpoint.objects.filter(run_id=self.run_id)
               .order_by("-created_at", "-id")[keep:] if not c.started_runs.exists()]
        Checkpoint.objects.filter(pk__in=[c.pk for c in old]).delete()
        return [c.path for c in old]

    def checkpoint_evaluated(self, path: str, eval_loss: float) -> None:
        """The eval loss of a checkpoint's model, measured after it was recorded: the
        final checkpoint is written before the final evaluation, and its row shows that."""
        Checkpoint.objects.filter(run_id=self.run_id, path=path).update(eval_loss=eval_loss)

    def checkpoints(self) -> list[tuple[str, str]]:
        """(path, sha256) of this run's checkpoints, newest first."""
        return list(Checkpoint.objects.filter(run_id=self.run_id)
                    .order_by("-created_at", "-id").values_list("path", "sha256"))

    def recover_merges(self, versions: dict[int, int], tokens: dict[int, int]) -> list[int]:
        """Record the merges a run's previous syncd published but did not live to write.

        A merge is acknowledged in Redis (GlobalsStore.publish) before its event reaches the
        database in the next batch, so a syncd killed in between leaves versions that no
        event names. For each such fragment one "merge" event with reason "recovered"
        covers them: the newest version, and the tokens of Redis's counter that the
        recorded merges do not account for. Call it before the run's first merge.
        Returns the fragments it recovered.

        Args:
            versions: fragment -> the newest published version (GlobalsStore.versions).
            tokens: fragment -> tokens merged (GlobalsStore.tokens_merged).
        """
        recorded, counted = _recorded_merges(self.run_id)
        recovered = []
        for p, version in sorted(versions.items()):
            if version > recorded.get(p, 0):
                self.event("merge", None, fragment=p, version=version, weights={},
                           tokens=tokens.get(p, 0) - counted.get(p, 0), reason="recovered",
                           after_version=recorded.get(p, 0))
                recovered.append(p)
        return recovered

    def end(self, state: str) -> None:
        """The run ended as `state`: completed (from running) or stopped (from stopping,
        where a user's stop put it)."""
        run = Run.objects.get(pk=self.run_id)
        if Run.State(state) in TRANSITIONS[Run.State(run.state)]:
            run.transition(state)


def _recorded_merges(run_id: int) -> tuple[dict[int, int], dict[int, int]]:
    """(fragment -> newest version its merge and rollback events name, fragment -> tokens
    its merge events count), summed by the database: a week-long run's thousands of
    merge events are not read into syncd at each rebuild of the run, only one row per
    fragment and the rollbacks (a few per run)."""
    merges = list(Event.objects.filter(run_id=run_id, kind="merge")
              .annotate(p=Cast(KT("detail__fragment"), BigIntegerField()))
              .values("p")
              .annotate(version=Max(Cast(KT("detail__version"), BigIntegerField())),
                        tokens=Sum(Cast(KT("detail__tokens"), BigIntegerField())))
                  .order_by())
    recorded = {int(row["p"]): int(row["version"] or 0) for row in merges
                if row["p"] is not None}
    counted = {int(row["p"]): int(row["tokens"] or 0) for row in merges
               if row["p"] is not None}
    for detail in Event.objects.filter(run_id=run_id, kind="rollback").values_list(
            "detail", flat=True):  # a rollback publishes every fragment's next version
        for p, v in enumerate(detail.get("versions") or []):
            recorded[p] = max(recorded.get(p, 0), int(v))
    return recorded, counted
