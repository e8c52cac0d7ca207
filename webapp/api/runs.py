"""Runs: list, create, read, archive, delete; start, stop, pause, resume, checkpoint;
their history and events. Each endpoint calls one service or report."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from ninja import Field, Query, Router, Schema, Status

from diloco.config import RUN_MODES, field_help
from webapp.api import schemas
from webapp.api.access import ApiError, allow, get_run
from webapp.api.schemas import answers
from webapp.runs import lifecycle, reports, validation
from webapp.runs.models import Checkpoint, Event, Run

router = Router(tags=["runs"])
config = Router(tags=["runs"])

MAX_OFFSET = 10**9
ORDERINGS = ("-created_at", "created_at", "name", "-name", "state", "-state", "id", "-id")


def summary(run: Run) -> dict[str, Any]:
    # A draft has never been served by syncd: nothing live to read from Redis.
    return reports.run_summary(run, status={} if run.state == Run.State.DRAFT else None)


class RunFilter(Schema):
    archived: bool = Field(False, description="true: the archived runs instead.")
    state: Run.State | None = None
    mode: Run.Mode | None = None
    ordering: Literal[ORDERINGS] = "-created_at"  # type: ignore[valid-type]
    limit: int = Field(100, ge=1, le=1000)
    offset: int = Field(0, ge=0, le=MAX_OFFSET)


@router.get("", auth=allow("view"), response=answers(schemas.RunList))
def list_runs(request: HttpRequest, filters: Query[RunFilter]) -> dict[str, Any]:
    """The runs with their live figures, newest first unless `ordering` says otherwise."""
    found = Run.objects.filter(archived=filters.archived).select_related("created_by")
    if filters.state:
        found = found.filter(state=filters.state)
    if filters.mode:
        found = found.filter(mode=filters.mode)
    page = found.order_by(filters.ordering, "-id").prefetch_related("islands")
    page = page[filters.offset:filters.offset + filters.limit]
    return {"count": found.count(), "runs": [summary(run) for run in page]}


@router.post("", auth=allow("create"), response=answers({201: schemas.RunOut}, body=True))
def create_run(request: HttpRequest, body: schemas.RunIn,
               response: HttpResponse) -> Status:
    """Save a new run as a draft. 422 with every problem of the name, mode and config."""
    initial = None
    if body.initial_checkpoint is not None:
        initial = Checkpoint.objects.select_related("run").filter(
            pk=body.initial_checkpoint).first()
        if initial is None:
            raise ApiError(422, "initial_checkpoint",
                           f"No checkpoint with id {body.initial_checkpoint}.")
    run = lifecycle.create_run(name=body.name, mode=body.mode, config=body.config,
                               user=request.auth, initial_checkpoint=initial)
    response["Location"] = f"/api/runs/{run.pk}"
    return Status(201, summary(run))


@router.get("/{run_id}", auth=allow("view"), response=answers(schemas.RunOut, 404))
def get_run_detail(request: HttpRequest, run_id: int) -> dict[str, Any]:
    """The run, its islands, versions (fragment -> version) and live figures."""
    return summary(get_run(run_id))


@router.patch("/{run_id}", auth=allow("edit"),
              response=answers(schemas.RunOut, 404, body=True))
def update_run(request: HttpRequest, run_id: int, body: schemas.RunPatch) -> dict[str, Any]:
    """Archive the run (hide it from the list) or bring it back."""
    run = get_run(run_id)
    lifecycle.archive_run(run, body.archived, request.auth)
    return summary(run)


@router.delete("/{run_id}", auth=allow("delete"),
               response=answers({204: None}, 404, 409))
def delete_run(request: HttpRequest, run_id: int) -> Status:
    """Delete a draft or a final run (409 for any other: stop it first), with its history."""
    lifecycle.delete_run(get_run(run_id), request.auth)
    return Status(204, None)


def _act(request: HttpRequest, run_id: int, service: Any) -> dict[str, Any]:
    run = get_run(run_id)
    service(run, request.auth)
    return summary(run)


@router.post("/{run_id}/start", auth=allow("operate"),
             response=answers({202: schemas.RunOut}, 404, 409))
def start_run(request: HttpRequest, run_id: int, response: HttpResponse) -> Status:
    """Start a draft; answers at once, the run `queued`. The control worker then waits
    a bounded time for the regions' pools to fill (ISLAND_POOL_FILL_WAIT_S), starts
    every island on a warm standby or its region's worker and makes the run `running`;
    `start_progress` says where it is (queued, filling_pools, starting_islands,
    started) and Location where to read it."""
    answer = _act(request, run_id, lifecycle.request_start)
    response["Location"] = f"/api/runs/{run_id}"
    return Status(202, answer)


@router.post("/{run_id}/stop", auth=allow("operate"),
             response=answers(schemas.RunOut, 404, 409))
def stop_run(request: HttpRequest, run_id: int) -> dict[str, Any]:
    """Stop a queued, running or paused run for good."""
    return _act(request, run_id, lifecycle.stop_run)


@router.post("/{run_id}/pause", auth=allow("operate"),
             response=answers(schemas.RunOut, 404, 409))
def pause_run(request: HttpRequest, run_id: int) -> dict[str, Any]:
    """Freeze every island where it is."""
    return _act(request, run_id, lifecycle.pause_run)


@router.post("/{run_id}/resume", auth=allow("operate"),
             response=answers(schemas.RunOut, 404, 409))
def resume_run(request: HttpRequest, run_id: int) -> dict[str, Any]:
    """Let the islands of a paused run go on."""
    return _act(request, run_id, lifecycle.resume_run)


@router.post("/{run_id}/checkpoint", auth=allow("operate"),
             response=answers({202: schemas.RunOut}, 404, 409))
def checkpoint_run(request: HttpRequest, run_id: int) -> Status:
    """Ask syncd for a checkpoint at its next pass (GET .../checkpoints lists it then)."""
    return Status(202, _act(request, run_id, lifecycle.checkpoint_now))


@router.get("/{run_id}/metrics", auth=allow("view"), response=answers(schemas.MetricList, 404))
def run_metrics(request: HttpRequest, run_id: int, since: datetime | None = None,
                limit: int = Query(reports.MAX_METRICS, ge=1, le=reports.MAX_METRICS),
                ) -> dict[str, Any]:
    """The run's history, oldest first: the points after `since` (ISO 8601; UTC when
    it names no zone)."""
    run = get_run(run_id)
    if since is not None and timezone.is_naive(since):
        since = since.replace(tzinfo=UTC)
    if since is not None:
        try:
            since = since.astimezone(UTC)
        except OverflowError:  # 0001-01-01T00:00+05:00 is before year 1 in UTC
            raise ApiError(422, "since", f"{since.isoformat()} is out of range in UTC "
                                         "(years 1 to 9999).") from None
    return {"metrics": reports.run_metrics(run, since, limit)}


@router.get("/{run_id}/events", auth=allow("view"), response=answers(schemas.EventList, 404))
def run_events(request: HttpRequest, run_id: int, after: int = 0,
               kind: Event.Kind | None = None,
               limit: int = Query(reports.MAX_EVENTS, ge=1, le=reports.MAX_EVENTS),
               ) -> dict[str, Any]:
    """The run's events with an id above `after`, oldest first."""
    run = get_run(run_id)
    return {"events": reports.run_events(run, after_id=after, limit=limit, kind=kind)}


# The `since` of a timeline: seconds since the epoch, up to the end of year 9999.
TIMELINE_SINCE = Query(None, ge=0, le=253402300799,
                       description="Seconds since the epoch: only what is from then on.")


@router.get("/{run_id}/timeline", auth=allow("view"), response=answers(schemas.RunTimeline, 404))
def run_timeline(request: HttpRequest, run_id: int,
                 since: float | None = TIMELINE_SINCE) -> dict[str, Any]:
    """Each island's life: its states and active faults as spans (an outage's with its
    recovery in seconds), its faults, rejoins and merges as marks; with `since`, only
    what is from then on, the spans that cross it cut there."""
    return reports.run_timeline(get_run(run_id), since=since)


@config.get("/config/schema", auth=allow("view"), response=answers(schemas.ConfigSchema))
def config_schema(request: HttpRequest) -> dict[str, Any]:
    """The run config's defaults, what each field means, the modes and the regions."""
    return {"defaults": lifecycle.default_config(), "help": field_help(),
            "modes": list(RUN_MODES), "regions": settings.REGIONS}


@config.post("/config/estimate", auth=allow("view"),
             response=answers(schemas.EstimateOut, body=True))
def config_estimate(request: HttpRequest, body: schemas.EstimateIn) -> dict[str, Any]:
    """The parameters of a run config's model and the memory Redis, syncd and each island
    host would need, against what the hosts declare, and each island's wire bytes per
    outer step with its link's seconds for them. 422 with the config's problems."""
    return validation.size_report(body.config)
