import json

from django.contrib.auth.decorators import login_required, permission_required
from django.db.models import Count
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_http_methods

from trainer.config import ConfigError
from webapp.dashboard.forms import RunForm
from webapp.runs.models import Run
from webapp.runs.services import create_run, default_config


@require_GET
@login_required
def runs(request: HttpRequest) -> HttpResponse:
    runs = Run.objects.select_related("created_by").annotate(island_count=Count("islands"))
    return render(request, "dashboard/runs.html", {"runs": runs})


@require_http_methods(["GET", "POST"])
@login_required
@permission_required("runs.add_run", raise_exception=True)
def new_run(request: HttpRequest) -> HttpResponse:
    if request.method == "POST":
        form = RunForm(request.POST)
        if form.is_valid():
            try:
                run = create_run(name=form.cleaned_data["name"], mode=form.cleaned_data["mode"],
                                 config=form.cleaned_data["config"], user=request.user)
            except ConfigError as e:
                form.add_config_error(e)
            else:
                return redirect("dashboard:run", run_id=run.pk)
    else:
        form = RunForm(initial={"mode": Run.Mode.DECOUPLED,
                                "config": json.dumps(default_config(), indent=2)})
    return render(request, "dashboard/run_new.html", {"form": form})


@require_GET
@login_required
def run_detail(request: HttpRequest, run_id: int) -> HttpResponse:
    run = get_object_or_404(Run.objects.select_related("created_by"), pk=run_id)
    return render(request, "dashboard/run_detail.html", {"run": run, "islands": run.islands.all()})
