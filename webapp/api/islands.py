"""Islands and faults: list, add, remove, rejoin, read an island's log; break an island,
a region or syncd on purpose. Each endpoint calls one service or fault function."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import Query, Router, Status

from diloco.config_parse import ConfigError
from webapp.api import schemas
from webapp.api.access import ApiError, allow, get_island, get_run
from webapp.api.runs import TIMELINE_SINCE, summary
from webapp.api.schemas import answers
from webapp.runs import faults, membership, reports
from webapp.runs.models import Run

router = Router(tags=["islands"])
system = Router(tags=["faults"])
MAX_LOG_LINES = 1000


def _island_out(run: Run, name: str) -> dict[str, Any]:
    return next(island for island in summary(run)["islands"] if island["name"] == name)


@router.get("/{run_id}/islands", auth=allow("view"), response=answers(schemas.IslandList, 404))
def list_islands(request: HttpRequest, run_id: int) -> dict[str, Any]:
    """The run's islands with their live state, active fault, tokens and version lag."""
    run = get_run(run_id)
    names = set(run.current_islands().values_list("name", flat=True))
    return {"islands": [i for i in summary(run)["islands"] if i["name"] in names]}


@router.post("/{run_id}/islands", auth=allow("edit"),
             response=answers({201: schemas.IslandOut}, 404, 409, body=True))
def add_island(request: HttpRequest, run_id: int, body: schemas.IslandIn) -> Status:
    """Add an island (an entry of the config's islands: name, region, speed, ...) to a
    draft, or to a running or paused run, where it starts training at once."""
    run = get_run(run_id)
    index = len(run.config.get("islands", []))
    try:
        island = membership.add_island(run, body.model_dump(exclude_unset=True), request.auth)
    except ConfigError as e:
        # "islands.4.region" is the new island's own field: "region".
        prefix = f"islands.{index}."
        raise ConfigError({key.removeprefix(prefix): messages
                           for key, messages in e.errors.items()}) from None
    return Status(201, _island_out(run, island.name))


@router.delete("/{run_id}/islands/{name}", auth=allow("edit"),
               response=answers({204: None}, 404, 409))
def remove_island(request: HttpRequest, run_id: int, name: str) -> Status:
    """Take an island out of the run; a training one saves its cursor and stops."""
    run = get_run(run_id)
    membership.remove_island(run, get_island(run, name), request.auth)
    return Status(204, None)


@router.post("/{run_id}/islands/{name}/faults", auth=allow(faults.action_for("island")),
             response=answers({202: schemas.FaultDone}, 404, 409, body=True))
def island_fault(request: HttpRequest, run_id: int, name: str,
                 body: schemas.IslandFault) -> Status:
    """Break an island: kill its process, or straggle, partition, degrade or corrupt it
    for duration_s seconds."""
    run = get_run(run_id)
    island = get_island(run, name)
    if body.kind == "kill":
        faults.kill_island(run, island, request.auth)
    else:
        faults.inject_fault(run, island, body.kind, body.duration_s, body.factor,
                            by=request.auth)
    return Status(202, {"kind": body.kind, "islands": [island.name]})


@router.post("/{run_id}/islands/{name}/rejoin", auth=allow("fault"),
             response=answers({202: schemas.IslandOut}, 404, 409))
def rejoin_island(request: HttpRequest, run_id: int, name: str) -> Status:
    """Start the island's next epoch, from the newest global fragments."""
    run = get_run(run_id)
    island = membership.rejoin_island(run, get_island(run, name), request.auth)
    return Status(202, _island_out(run, island.name))


@router.get("/{run_id}/islands/{name}/log", auth=allow("view"),
            response=answers(schemas.IslandLog, 404))
def island_log(request: HttpRequest, run_id: int, name: str,
               lines: int = Query(50, ge=1, le=MAX_LOG_LINES)) -> dict[str, Any]:
    """The last lines of the island's log on the web app's host."""
    run = get_run(run_id)
    return {"lines": reports.island_log(run, get_island(run, name), lines)}


@router.get("/{run_id}/islands/{name}/timeline", auth=allow("view"),
            response=answers(schemas.RunTimeline, 404))
def island_timeline(request: HttpRequest, run_id: int, name: str,
                    since: float | None = TIMELINE_SINCE) -> dict[str, Any]:
    """The island's life (GET /api/runs/{run_id}/timeline, for this island alone)."""
    run = get_run(run_id)
    return reports.run_timeline(run, [get_island(run, name).name], since)


@router.post("/{run_id}/regions/{region}/faults", auth=allow(faults.action_for("region")),
             response=answers({202: schemas.FaultDone}, 404, 409, body=True))
def region_fault(request: HttpRequest, run_id: int, region: str,
                 body: schemas.RegionFault) -> Status:
    """A region outage: every island of the run in that region is killed."""
    run = get_run(run_id)
    regions = sorted(set(run.current_islands().values_list("region", flat=True)))
    if region not in regions:
        raise ApiError(404, "region", f"Run {run.pk} has no island in region {region!r} "
                                      f"(its regions: {', '.join(regions) or 'none'}).")
    hit = faults.kill_region(run, region, request.auth)
    return Status(202, {"kind": body.kind, "islands": [island.name for island in hit]})


@system.post("/system/faults", auth=allow(faults.action_for("system")),
             response=answers({202: schemas.FaultDone}, body=True))
def system_fault(request: HttpRequest, body: schemas.SystemFault) -> Status:
    """Kill syncd (admins): every run stalls until its supervisor has it back."""
    faults.kill_syncd(request.auth)
    return Status(202, {"kind": body.kind, "islands": []})
