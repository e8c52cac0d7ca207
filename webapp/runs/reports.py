"""What a run looks like to its readers: the database row joined with syncd's live
status, its history, its events and its islands' logs. The API and the pages both
read these."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.utils import timezone
from redis.exceptions import RedisError

from syncd.status import link_state
from trainer.island_logs import island_log_path, tail_lines
from webapp.runs.models import Event, Island, Metric, Run
from webapp.runs.stores import run_store
from webapp.runs.timeline import island_timeline, lane_since

MAX_METRICS = 5000
MAX_EVENTS = 1000
# The timeline reads at most this many of a run's latest outage events, merge events
# and metric rows.
TIMELINE_ROWS = 20000
# What the islands' outages are made of: a few per fault, so the timeline reads them
# all; merges and metric rows come every few seconds, and with `since` it reads only
# those from then on.
OUTAGE_KINDS = (Event.Kind.FAULT, Event.Kind.ISLAND_LOST, Event.Kind.ISLAND_REVIVED,
                Event.Kind.REJOIN)
# The fields of syncd's status (syncd.records.RunStatus) a run's summary carries, and of
# each island's (IslandStatus) with their value before syncd serves the run. Tokens merged
# and outer steps are the Run row's, which syncd keeps current; an island's state, fault,
# tokens and link are joined with its row's.
RUN_FIELDS = ("goodput", "uptime", "startup_s", "train_loss", "eval_loss", "eval_tokens",
              "eval_bpb", "alive_islands", "max_stall_s", "corpus")
ISLAND_FIELDS = {"version_lag": 0, "tokens_per_s": 0.0, "step_time_s": None,
                 "cpu_share": None, "backpressure_wait_s": 0.0, "slot_wait_s": 0.0,
                 "rejoin_warm": None, "heartbeat_age_s": None, "staleness": None}


def run_summary(run: Run, status: dict[str, Any] | None = None) -> dict[str, Any]:
    """The run (Run.to_dict: tokens merged and outer_steps, which syncd keeps current)
    with its progress and the live figures of syncd's latest status: versions (fragment
    index -> version), goodput, uptime, start-up, train and eval loss, and per island its
    live state, active fault, tokens, step time, share of its host's CPU, backpressure
    and upload slot waits, version_lag and link to syncd (syncd.status.link;
    from the island's own state once the run is over). A run syncd has not served yet
    has empty versions and None for the figures."""
    data = run.to_dict()
    if status is None:
        try:
            status = run_store(run).status() or {}
        except RedisError:  # Redis down: the database's view, and say why
            status = {}
            data["live_status"] = "unavailable: Redis cannot be reached"
    data["versions"] = {str(p): v for p, v in enumerate(status.get("versions", []))}
    for field in RUN_FIELDS:
        data[field] = status.get(field)
    data["progress"] = progress(run)
    live = status.get("islands", {})
    for island in data["islands"]:
        now = live.get(island["name"], {})
        island["fault"] = now.get("fault", island["fault"])  # syncd's, when it has one
        island.update({field: now.get(field, default) for field, default in ISLAND_FIELDS.items()})
        running = run.is_running_or_paused
        if running and "state" in now:
            island["state"] = now["state"]
        island["link"] = now["link"] if running and "link" in now else {
            "state": link_state(island["state"], island["fault"]),
            "bytes_up": 0, "bytes_down": 0}
        island["tokens"] = max(island["tokens"], now.get("tokens", 0))
    return data


def progress(run: Run) -> float:
    """Tokens merged against the run's token budget, 0 to 1."""
    budget = run.config.get("budget", {}).get("total_tokens") or 0
    return min(1.0, run.tokens / budget) if budget else 0.0


def run_metrics(run: Run, since: datetime | None = None, limit: int = MAX_METRICS,
                newest: bool = False) -> list[dict[str, Any]]:
    """The run's history points after `since`, oldest first, at most `limit`: the first
    `limit` of them (a page to go on from), or with `newest` the last (a chart's)."""
    points = Metric.objects.filter(run=run)
    if since is not None:
        points = points.filter(time__gt=since)
    if newest:
        return [m.to_dict() for m in reversed(points.order_by("-time", "-id")[:limit])]
    return [m.to_dict() for m in points.order_by("time", "id")[:limit]]


def run_events(run: Run, after_id: int = 0, limit: int = MAX_EVENTS,
               kind: str | None = None, newest: bool = False) -> list[dict[str, Any]]:
    """The run's events with an id above `after_id`, oldest first, at most `limit`: the
    first `limit` of them (a page to go on from), or with `newest` the last (a page's)."""
    events = Event.objects.filter(run=run, id__gt=after_id).select_related("actor")
    if kind:
        events = events.filter(kind=kind)
    names = dict(Island.objects.filter(run=run).values_list("id", "name"))
    if newest:
        return [e.to_dict(names) for e in reversed(events.order_by("-id")[:limit])]
    return [e.to_dict(names) for e in events.order_by("id")[:limit]]


def run_timeline(run: Run, islands: list[str] | None = None,
                 since: float | None = None) -> dict[str, Any]:
    """Each island's lane (webapp.runs.timeline.island_timeline), all of the run's
    islands unless `islands` names some, from its start to now (to its end once it is
    over); times in seconds since the epoch.

    With `since`, only the lanes from then on (webapp.runs.timeline.lane_since): the
    merges and metric rows from `since` on and the last row before it are read, not
    the run's whole history; the outage events are read in full, so that an outage
    that began before `since` keeps its cause and its recovery.
    """
    names = islands if islands is not None else run.island_names()
    events = Event.objects.filter(run=run)
    outage_events = events.filter(kind__in=OUTAGE_KINDS)
    merges = events.filter(kind=Event.Kind.MERGE)
    rows = Metric.objects.filter(run=run)
    before: list[tuple[datetime, dict[str, Any] | None]] = []
    if since is not None:
        at = datetime.fromtimestamp(since, tz=UTC)
        merges = merges.filter(time__gte=at)
        before = list(rows.filter(time__lt=at).order_by("-time", "-id")
                      .values_list("time", "islands")[:1])  # the islands' states at `since`
        rows = rows.filter(time__gte=at)
    kept = [{"kind": kind, "time": time.timestamp(), "island": island, "detail": detail}
            for chosen in (outage_events, merges)
            for kind, time, island, detail in chosen.order_by("-time", "-id").values_list(
                "kind", "time", "island__name", "detail")[:TIMELINE_ROWS]]
    samples = [(time.timestamp(), points or {}) for time, points in
               before + list(rows.order_by("-time", "-id")
                             .values_list("time", "islands")[:TIMELINE_ROWS])]
    end = (run.finished_at or timezone.now()).timestamp()
    start = min([t for t, _ in samples] + [e["time"] for e in kept]
                + [run.started_at.timestamp() if run.started_at else end])
    lanes = [island_timeline(name, kept, samples, end) for name in names]
    if since is not None:
        lanes = [lane_since(lane, since) for lane in lanes]
    return {"start": start, "end": end, "since": since, "islands": lanes}


def island_log(run: Run, island: Island | str, lines: int = 50) -> list[str]:
    """The last lines of an island's log (its output and its tracebacks): what its
    supervisor last put in Redis, wherever it runs, else the file on this host."""
    name = island.name if isinstance(island, Island) else island
    shipped = run_store(run).signals.log(name)
    if shipped is not None:
        return shipped[-lines:]
    return tail_lines(island_log_path(settings.LOG_DIR, run.pk, name), lines)
