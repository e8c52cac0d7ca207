"""/metrics: the runs and their islands in Prometheus' text format, for operators.

A scraper sends `Authorization: Bearer <settings.METRICS_TOKEN>`; a browser needs an
operator's (or a staff member's) session. Every gauge is labelled by the run's id;
archipelago_run_info carries its name and mode. Running and paused runs read
syncd's status from Redis through reports.run_summary, the others the database only.
Archived runs are left out.

prometheus_client writes the text: RunsCollector reads the figures on each scrape into
a registry of this module's own (not prometheus_client's global one).
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable, Iterator
from typing import Any

import redis
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from syncd.records import IslandStatus, RunStatus
from webapp.api.status_schema import gauges
from webapp.runs import reports, roles
from webapp.runs.models import Island, Run

# generate_latest writes version 0.0.4 of the text format (CONTENT_TYPE_LATEST names 1.0.0).
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4

# name -> (help, the run_summary field it reads): the Run row's, and syncd's status's
# (syncd.records.RunStatus, IslandStatus: the gauges take their names and help).
RUN_GAUGES = {
    "archipelago_run_tokens": ("Tokens merged into the global model.", "tokens"),
    "archipelago_run_progress": ("Tokens merged against the token budget, 0 to 1.", "progress"),
    "archipelago_run_outer_steps": ("The smallest fragment version.", "outer_steps"),
    **gauges("archipelago_run", RunStatus,
             ("goodput", "uptime", "train_loss", "eval_loss", "eval_tokens", "eval_bpb",
              "alive_islands")),
}
ISLAND_GAUGES = gauges("archipelago_island", IslandStatus,
                       ("tokens", "tokens_per_s", "version_lag", "epoch",
                        "backpressure_wait_s", "slot_wait_s"))

class RunsCollector(Collector):
    """The gauges of every run that is not archived, read afresh on each collect()."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        runs = list(Run.objects.filter(archived=False).prefetch_related("islands")
                    .order_by("id"))
        redis_up = 1
        summaries = []
        for run in runs:
            status: dict[str, Any] | None = None if run.is_running_or_paused else {}
            try:
                summaries.append(reports.run_summary(run, status=status))
            except redis.RedisError:
                redis_up = 0
                summaries.append(reports.run_summary(run, status={}))
        counts = {state: 0 for state in Run.State.values}
        for run in Run.objects.values_list("state", flat=True):
            counts[run] = counts.get(run, 0) + 1
        yield gauge("archipelago_runs", "Runs by state, archived ones too.", ["state"],
                    (([state], count) for state, count in counts.items()))
        yield gauge("archipelago_redis_up", "Whether syncd's status could be read from Redis.",
                    [], [([], redis_up)])
        yield gauge("archipelago_run_info", "A run's name and mode (value 1).",
                    ["run", "name", "mode"],
                    (([s["id"], s["name"], s["mode"]], 1) for s in summaries))
        yield gauge("archipelago_run_state", "1 for the run's state, 0 for the others.",
                    ["run", "state"],
                    (([s["id"], state], int(s["state"] == state))
                     for s in summaries for state in Run.State.values))
        for name, (help_text, field) in RUN_GAUGES.items():
            yield gauge(name, help_text, ["run"], (([s["id"]], s.get(field)) for s in summaries))
        islands = [(s["id"], island) for s in summaries for island in s["islands"]]
        yield gauge("archipelago_island_state", "1 for the island's state, 0 for the others.",
                    ["run", "island", "region", "state"],
                    (([run, i["name"], i["region"], state], int(i["state"] == state))
                     for run, i in islands for state in Island.State.values))
        yield gauge("archipelago_island_fault",
                    "1 for the island's active fault, 0 for the others.",
                    ["run", "island", "fault"],
                    (([run, i["name"], fault], int(i["fault"] == fault))
                     for run, i in islands for fault in Island.Fault.values))
        for name, (help_text, field) in ISLAND_GAUGES.items():
            yield gauge(name, help_text, ["run", "island"],
                        (([run, i["name"]], i.get(field)) for run, i in islands))


def gauge(name: str, help_text: str, labels: list[str],
          samples: Iterable[tuple[list[Any], Any]]) -> GaugeMetricFamily:
    """One gauge family with a sample per (label values, value) whose value is known."""
    family = GaugeMetricFamily(name, help_text, labels=labels)
    for values, value in samples:
        if value is not None:
            family.add_metric([str(v) for v in values], value)
    return family


REGISTRY = CollectorRegistry()
REGISTRY.register(RunsCollector())


def allowed(request: HttpRequest) -> bool | None:
    """True for the scraper's token or an operator's session; None when nobody signed in
    (401), False for a signed-in user who may not (403)."""
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    expected = settings.METRICS_TOKEN
    if expected and scheme.lower() == "bearer" \
            and hmac.compare_digest(token.strip().encode(), expected.encode()):
        return True
    user = request.user
    if not user.is_authenticated:
        return None
    return bool(user.is_staff) or roles.can(user, "operate")


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """The gauges of every run that is not archived."""
    verdict = allowed(request)
    if verdict is None:
        response = HttpResponse("Send Authorization: Bearer <METRICS_TOKEN>, or sign in as "
                                "an operator.\n", status=401, content_type=CONTENT_TYPE)
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    if not verdict:
        return HttpResponse("The metrics are for operators.\n", status=403,
                            content_type=CONTENT_TYPE)
    return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE)
