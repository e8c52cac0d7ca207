"""The control room's pages. Each view fetches through the run services and reports,
asks webapp.runs.roles who may do what, and renders; the live parts of a page are
fed by its websocket and act through the JSON API."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Count, OuterRef, Subquery
from django.http import FileResponse, Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.templatetags.static import static
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from diloco.config import field_help
from diloco.config_parse import ConfigError
from diloco.presets import PRESETS
from syncd.records import RunStatus, fields
from webapp.dashboard.forms import RunForm
from webapp.dashboard.regions import map_view, region_positions
from webapp.runs import roles
from webapp.runs.api_token import ApiToken
from webapp.runs.lifecycle import create_run
from webapp.runs.models import Checkpoint, Island, Metric, Run, Simulation
from webapp.runs.presets import preset_config
from webapp.runs.reports import progress, run_events, run_metrics, run_summary, run_timeline
from webapp.runs.simulations import DEFAULT_SWEEP, check_sweep
from webapp.runs.tasks import start_simulation

SORTS = {"name": "name", "mode": "mode", "state": "state", "progress": "tokens",
         "goodput": "goodput", "eval_loss": "eval_loss", "started": "started_at",
         "created": "created_at"}
CHART_POINTS = 500
EVENT_ROWS = 50  # the run page's newest events; the live page adds what comes after

# The run bar's actions, each with the states of a run it is offered in.
RUN_ACTIONS = {"start": (Run.State.DRAFT,), "pause": (Run.State.RUNNING,),
               "resume": (Run.State.PAUSED,), "checkpoint": Run.RUNNING_OR_PAUSED,
               "stop": Run.UNDER_WAY}
# What the fault buttons say where a fault's own name (Island.Fault) would not do.
FAULT_LABELS = {Island.Fault.DEGRADE: "Degrade link", Island.Fault.CORRUPT: "Corrupt next update"}
# An island counted alive in its region: training, or elastic at its barrier (waiting) or
# in a whole-job restart (restarting), two states of trainer/runner.py's heartbeats that
# the Island rows never hold.
ALIVE_STATES = (Island.State.TRAINING.value, "waiting", "restarting")


def _id_param(request: HttpRequest, name: str) -> int:
    """A query parameter naming a row by id; 0 (no row) when it is not a whole number."""
    value = request.GET.get(name, "")
    return int(value) if value.isascii() and value.isdecimal() else 0


def _latest(field: str) -> Subquery:
    points = Metric.objects.filter(run=OuterRef("pk"), **{f"{field}__isnull": False})
    return Subquery(points.order_by("-time", "-id").values(field)[:1])


@require_GET
@login_required
def runs(request: HttpRequest) -> HttpResponse:
    key = request.GET.get("sort", "created")
    descending = key.startswith("-")
    field = SORTS.get(key.lstrip("-"), "created_at")
    archived = request.GET.get("archived") == "1"
    rows = (Run.objects.filter(archived=archived).select_related("created_by")
            .annotate(island_count=Count("islands"), goodput=_latest("goodput"),
                      eval_loss=_latest("eval_loss"))
            .order_by(f"{'-' if descending else ''}{field}", "-id"))
    for run in rows:
        run.progress = progress(run)
    return render(request, "dashboard/runs.html", {
        "runs": rows, "sort": key, "archived": archived, "sorts": list(SORTS),
        "can_create": roles.can(request.user, "create")})


@require_http_methods(["GET", "POST"])
@login_required
def new_run(request: HttpRequest) -> HttpResponse:
    roles.require(request.user, "create")
    preset = request.GET.get("preset", "demo")
    if preset not in PRESETS:
        preset = "demo"
    config = preset_config(preset, settings.REGIONS)
    if request.method == "POST":
        form = RunForm(request.POST, config=config)
        if form.is_valid():
            try:
                run = create_run(name=form.cleaned_data["name"], mode=form.cleaned_data["mode"],
                                 config=form.config(), user=request.user,
                                 initial_checkpoint=form.cleaned_data["initial_checkpoint"])
            except ConfigError as e:
                form.add_config_error(e)
            else:
                messages.success(request, f"Run {run.name!r} created as a draft: start it "
                                          "when you are ready.")
                return redirect("dashboard:run", run_id=run.pk)
    else:
        start = Checkpoint.objects.filter(pk=_id_param(request, "from"),
                                          run__isnull=False).select_related("run").first()
        if start is not None:  # "new run from here": the checkpoint's run's settings
            config = start.run.config
        form = RunForm(config=config, initial={
            "mode": start.run.mode if start else Run.Mode.DECOUPLED,
            "initial_checkpoint": start,
            "name": f"{start.run.name} from step {start.outer_step}" if start else ""})
    return render(request, "dashboard/run_new.html", {
        "form": form, "presets": [(k, label) for k, (label, _) in PRESETS.items()],
        "preset": preset, "regions": settings.REGIONS, "island_help": {
            k.split(".", 1)[1]: v for k, v in field_help().items() if k.startswith("islands")}})


# The run page's figures: (label, element id, the field of syncd's status it shows); each
# one's tooltip is the field's help (syncd.records.RunStatus), and run.js fills them in.
FIGURES = (("Goodput", "goodput", "goodput"), ("Uptime", "uptime", "uptime"),
           ("Start-up", "startup", "startup_s"), ("Train loss", "train-loss", "train_loss"),
           ("Eval loss", "eval-loss", "eval_loss"), ("Bits per byte", "eval-bpb", "eval_bpb"),
           ("Outer steps", "outer-steps", "outer_steps"), ("tau", "tau", "tau"),
           ("Versions", "versions", "versions"),
           ("Islands alive", "islands-alive", "alive_islands"))


def figures() -> list[tuple[str, str, str]]:
    """The run page's figures: (label, element id, help), the help from the record."""
    described = fields(RunStatus)
    return [(label, element, described[field][1]) for label, element, field in FIGURES]


def _vocabulary() -> dict[str, Any]:
    """The run page's states, faults and actions as the models name them, so that its
    script restates none: the actions offered in each run state, the run states under
    way, the island states counted alive, and the island's fault buttons in order (a
    kill, then each fault an island can carry; `lasts`: it lasts the seconds its button
    asks for, where a kill is at once and a corrupt takes the next update), and the words
    of a start's progress."""
    faults = [{"kind": "kill", "label": "Kill", "lasts": False}] + [
        {"kind": fault.value, "label": FAULT_LABELS.get(fault, fault.label),
         "lasts": fault != Island.Fault.CORRUPT}
        for fault in Island.Fault if fault != Island.Fault.NONE]
    return {"actions": {state.value: [action for action, states in RUN_ACTIONS.items()
                                      if state in states] for state in Run.State},
            "under_way": [state.value for state in Run.UNDER_WAY],
            "start_progress": {p.value: p.label for p in Run.StartProgress if p.value},
            "alive": list(ALIVE_STATES), "faults": faults}


@require_GET
@login_required
def run_detail(request: HttpRequest, run_id: int) -> HttpResponse:
    run = get_object_or_404(Run.objects.select_related("created_by"), pk=run_id)
    summary = run_summary(run)
    checkpoints = [{"id": c.pk, "outer_step": c.outer_step, "eval_loss": c.eval_loss,
                    "bytes": c.bytes, "created_at": c.created_at.isoformat()}
                   for c in run.checkpoints.order_by("-created_at")]
    regions = region_positions(sorted({i["region"] for i in summary["islands"]}
                                      | {settings.SYNCD_REGION}))
    page = {
        "run": summary, "metrics": run_metrics(run, limit=CHART_POINTS, newest=True),
        "events": run_events(run, limit=EVENT_ROWS, newest=True), "checkpoints": checkpoints,
        "timeline": run_timeline(run),
        "map": {"regions": regions, "syncd": settings.SYNCD_REGION,
                "view": map_view(list(regions.values())),
                "topojson": static("dashboard/topojson/")},
        "all_regions": settings.REGIONS, "chart_points": CHART_POINTS,
        "vocabulary": _vocabulary(),
        "can": {action: roles.can(request.user, action)
                for action in ("operate", "fault", "edit", "delete", "admin")},
    }
    return render(request, "dashboard/run_detail.html", {"run": run, "page": page,
                                                         "summary": summary,
                                                         "figures": figures()})


@require_GET
@login_required
def compare(request: HttpRequest) -> HttpResponse:
    ids = [int(i) for i in request.GET.getlist("runs") if i.isascii() and i.isdecimal()][:8]
    chosen = list(Run.objects.filter(pk__in=ids))
    series = [{"id": run.pk, "name": run.name, "mode": run.mode,
               "metrics": run_metrics(run, newest=True)} for run in chosen]
    return render(request, "dashboard/compare.html", {
        "series": series, "chosen": {run.pk for run in chosen},
        "runs": Run.objects.exclude(state=Run.State.DRAFT).order_by("-created_at")[:100]})


@require_http_methods(["GET", "POST"])
@login_required
def tokens(request: HttpRequest) -> HttpResponse:
    made: str | None = None
    if request.method == "POST":
        # NUL has no place in a name, and PostgreSQL cannot store it.
        name = request.POST.get("name", "").replace("\x00", "").strip()[:100]
        _, made = ApiToken.issue(request.user, name)
    return render(request, "dashboard/tokens.html", {
        "tokens": request.user.api_tokens.all(), "made": made})


@require_POST
@login_required
def revoke_token(request: HttpRequest, token_id: int) -> HttpResponse:
    token = get_object_or_404(ApiToken, pk=token_id, user=request.user)
    token.delete()
    messages.success(request, f"Token {token.hint}… revoked.")
    return redirect("dashboard:tokens")



@require_http_methods(["GET", "POST"])
@login_required
def simulate(request: HttpRequest) -> HttpResponse:
    """Sweeps of the datacenter simulator: start one (operators), watch its progress and
    read its tables and plots (everyone)."""
    errors: dict[str, str] = {}
    values = {"chips": ", ".join(str(c) for c in DEFAULT_SWEEP["chips"]),
              "islands": ", ".join(str(n) for n in DEFAULT_SWEEP["islands"]),
              "hours": DEFAULT_SWEEP["duration_s"] / 3600, "knobs": True}
    if request.method == "POST":
        roles.require(request.user, "operate")
        values = {k: request.POST.get(k, "") for k in ("chips", "islands", "hours")}
        values["knobs"] = request.POST.get("knobs") == "on"
        try:
            sweep = check_sweep(values)
        except ValueError as e:
            errors = e.args[0]
        else:
            simulation = start_simulation(sweep, request.user)
            return redirect(f"{request.path}?id={simulation.pk}")
    shown = Simulation.objects.filter(pk=_id_param(request, "id")).first() or \
        Simulation.objects.filter(state=Simulation.State.COMPLETED).first()
    return render(request, "dashboard/simulate.html", {
        "values": values, "errors": errors, "can_start": roles.can(request.user, "operate"),
        "shown": shown.to_dict() if shown else None,
        "recent": Simulation.objects.all()[:10]})


REPORTS = ("goodput", "goodput-quick", "simulate", "simulate-quick", "scale", "scale-quick",
           "scale-long")


@require_GET
@login_required
def benchmark_report(request: HttpRequest, name: str) -> HttpResponse:
    """A benchmark's HTML report (bench/results/NAME.html, plotly.js inside it) as the
    last `python -m bench goodput|simulate` on this host wrote it."""
    path = Path(settings.BENCH_RESULTS_DIR) / f"{name}.html"
    if name not in REPORTS or not path.is_file():
        raise Http404(f"No {name} report here: run python -m bench "
                      f"{name.split('-')[0]} on this host first.")
    return FileResponse(path.open("rb"), content_type="text/html; charset=utf-8")
