"""/metrics: the runs and their islands in Prometheus' text format, for operators.

A scraper sends `Authorization: Bearer <settings.METRICS_TOKEN>`; a browser needs an
operator's (or a staff member's) session. Every gauge is labelled by the run's id;
archipelago_run_info carries its name and mode. Live runs (running, paused) read
syncd's status from Redis through reports.run_summary, the others the database only.
Archived runs are left out.
"""

from __future__ import annotations

import hmac
import math
from collections.abc import Iterable
from typing import Any

import redis
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET

from webapp.runs import reports, roles
from webapp.runs.models import Island, Run

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LIVE_STATES = (Run.State.RUNNING, Run.State.PAUSED)

# name -> (help, the run_summary field it reads)
RUN_GAUGES = {
    "archipelago_run_tokens": ("Tokens merged into the global model.", "tokens"),
    "archipelago_run_progress": ("Tokens merged against the token budget, 0 to 1.", "progress"),
    "archipelago_run_outer_steps": ("The smallest fragment version.", "outer_steps"),
    "archipelago_run_goodput": ("Useful island-seconds / allocated island-seconds.", "goodput"),
    "archipelago_run_uptime": ("1 - long merge gaps / wall time.", "uptime"),
    "archipelago_run_train_loss": ("The islands' recent training loss.", "train_loss"),
    "archipelago_run_eval_loss": ("The global model's latest evaluation loss.", "eval_loss"),
    "archipelago_run_live_islands": ("Islands syncd hears from.", "live_islands"),
}
ISLAND_GAUGES = {
    "archipelago_island_tokens": ("Tokens the island trained on.", "tokens"),
    "archipelago_island_tokens_per_second": ("The island's recent throughput.", "tokens_per_s"),
    "archipelago_island_version_lag": (
        "Newest version minus the base version of the island's last update.", "version_lag"),
    "archipelago_island_epoch": ("The island's incarnation.", "epoch"),
}


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
    return HttpResponse(render(), content_type=CONTENT_TYPE)


def render() -> str:
    """The exposition text."""
    runs = list(Run.objects.filter(archived=False).prefetch_related("islands").order_by("id"))
    redis_up = 1
    summaries = []
    for run in runs:
        status: dict[str, Any] | None = None if run.state in LIVE_STATES else {}
        try:
            summaries.append(reports.run_summary(run, status=status))
        except redis.RedisError:
            redis_up = 0
            summaries.append(reports.run_summary(run, status={}))
    lines: list[str] = []
    counts = {state: 0 for state in Run.State.values}
    for run in Run.objects.values_list("state", flat=True):
        counts[run] = counts.get(run, 0) + 1
    _family(lines, "archipelago_runs", "Runs by state, archived ones too.",
            (({"state": state}, count) for state, count in counts.items()))
    _family(lines, "archipelago_redis_up", "Whether syncd's status could be read from Redis.",
            [({}, redis_up)])
    _family(lines, "archipelago_run_info", "A run's name and mode (value 1).",
            (({"run": s["id"], "name": s["name"], "mode": s["mode"]}, 1) for s in summaries))
    _family(lines, "archipelago_run_state", "1 for the run's state, 0 for the others.",
            (({"run": s["id"], "state": state}, int(s["state"] == state))
             for s in summaries for state in Run.State.values))
    for name, (help_text, field) in RUN_GAUGES.items():
        _family(lines, name, help_text, (({"run": s["id"]}, s.get(field)) for s in summaries))
    islands = [(s["id"], island) for s in summaries for island in s["islands"]]
    _family(lines, "archipelago_island_state",
            "1 for the island's state, 0 for the others.",
            (({"run": run, "island": i["name"], "region": i["region"], "state": state},
              int(i["state"] == state)) for run, i in islands for state in Island.State.values))
    _family(lines, "archipelago_island_fault",
            "1 for the island's active fault, 0 for the others.",
            (({"run": run, "island": i["name"], "fault": fault},
              int(i.get("active_fault", i["fault"]) == fault))
             for run, i in islands for fault in Island.Fault.values))
    for name, (help_text, field) in ISLAND_GAUGES.items():
        _family(lines, name, help_text,
                (({"run": run, "island": i["name"]}, i.get(field)) for run, i in islands))
    return "\n".join(lines) + "\n"


def _family(lines: list[str], name: str, help_text: str,
            samples: Iterable[tuple[dict[str, Any], Any]]) -> None:
    """One metric family: HELP, TYPE and a line per sample whose value is known."""
    lines.append(f"# HELP {name} {help_text}")
    lines.append(f"# TYPE {name} gauge")
    for labels, value in samples:
        if value is None:
            continue
        text = ",".join(f'{key}="{_escape(str(label))}"' for key, label in labels.items())
        lines.append(f"{name}{{{text}}} {_number(value)}" if text else f"{name} {_number(value)}")


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: Any) -> str:
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, int):
        return str(value)
    value = float(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)
