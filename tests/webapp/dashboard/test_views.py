from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from diloco.config_parse import parse_config
from diloco.island import initial_model
from diloco.shapes import parameter_count
from syncd.checkpoint import save
from syncd.records import RunStatus, fields
from webapp.dashboard.views import CHART_POINTS, EVENT_ROWS, FIGURES
from webapp.runs.api_token import ApiToken
from webapp.runs.lifecycle import create_run
from webapp.runs.models import Checkpoint, Event, Island, Metric, Run
from webapp.runs.presets import preset_config
from webapp.runs.reports import MAX_EVENTS, MAX_METRICS

pytestmark = pytest.mark.django_db


def form_data(client: Client, path: str = "/runs/new/", **changes) -> dict[str, str]:
    """What the browser would post: every value the form shows, with `changes`."""
    form = client.get(path).context["form"]
    data = {"name": "from the form"}
    for name in form.fields:
        value = form[name].value()
        if isinstance(value, bool):
            if value:
                data[name] = "on"
        elif value is not None and name not in data:
            data[name] = str(value.pk if hasattr(value, "pk") else value)
    for n, row in enumerate(form.island_rows):
        for key, value in row["values"].items():
            data[f"islands-{n}-{key}"] = str(value)
    data.update(changes)
    return {k: v for k, v in data.items() if v is not None}


@pytest.mark.parametrize("path", ["/", "/runs/new/", "/runs/1/", "/compare/", "/account/tokens/"])
def test_it_sends_anonymous_visitors_to_the_login_page(client, path):
    response = client.get(path)

    assert response.status_code == 302
    assert response["Location"] == f"/accounts/login/?next={path}"


def test_the_login_page_logs_a_user_in(client, django_user_model):
    django_user_model.objects.create_user("lena", password="a long test password")

    page = client.get("/accounts/login/")
    response = client.post("/accounts/login/",
                           {"username": "lena", "password": "a long test password"})

    assert page.status_code == 200
    assert response.status_code == 302
    assert response["Location"] == "/"
    assert client.get("/").status_code == 200


def test_logout_is_a_post(viewer_client):
    response = viewer_client.post("/accounts/logout/")

    assert response.status_code == 302
    assert viewer_client.get("/").status_code == 302


def test_the_runs_page_lists_runs_with_progress_goodput_and_eval_loss(viewer_client):
    run = create_run(name="listed run", mode="elastic",
                     config={"budget": {"total_tokens": 1000}}, user=None)
    Run.objects.filter(pk=run.pk).update(tokens=250)
    Metric.objects.create(run=run, tokens=250, outer_steps=3, goodput=0.875, eval_loss=2.5)

    response = viewer_client.get("/")

    assert response.status_code == 200
    content = response.content.decode()
    assert "listed run" in content and "elastic" in content
    assert "width: 25%" in content
    assert "0.88" in content and "2.500" in content


def test_the_runs_page_sorts_by_the_column_asked_for(viewer_client):
    for name in ("beta", "alpha", "gamma"):
        create_run(name=name, mode="decoupled", config={}, user=None)

    ascending = [r.name for r in viewer_client.get("/?sort=name").context["runs"]]
    descending = [r.name for r in viewer_client.get("/?sort=-name").context["runs"]]

    assert ascending == ["alpha", "beta", "gamma"]
    assert descending == ["gamma", "beta", "alpha"]


def test_archived_runs_leave_the_list_for_the_archive(viewer_client):
    create_run(name="kept", mode="decoupled", config={}, user=None)
    hidden = create_run(name="old", mode="decoupled", config={}, user=None)
    Run.objects.filter(pk=hidden.pk).update(archived=True)

    current = [r.name for r in viewer_client.get("/").context["runs"]]
    archive = [r.name for r in viewer_client.get("/?archived=1").context["runs"]]

    assert (current, archive) == (["kept"], ["old"])


def test_the_runs_page_offers_new_runs_only_to_operators(viewer_client, operator_client):
    assert b"/runs/new/" not in viewer_client.get("/").content
    assert b"/runs/new/" in operator_client.get("/").content


def test_viewers_get_403_on_the_new_run_page(viewer_client):
    assert viewer_client.get("/runs/new/").status_code == 403
    assert viewer_client.post("/runs/new/", {"name": "x"}).status_code == 403
    assert not Run.objects.exists()


def test_the_new_run_form_starts_from_the_demo_preset_with_help_for_each_setting(
        operator_client):
    response = operator_client.get("/runs/new/")

    form = response.context["form"]
    assert response.status_code == 200
    assert len(form.island_rows) == 4
    assert len({row["values"]["region"] for row in form.island_rows}) == 2
    assert form["sync.min_quorum"].value() == 2
    assert b"K: updates needed before a fragment may merge." in response.content


def test_the_paper_preset_puts_one_island_in_each_of_four_us_regions(operator_client):
    form = operator_client.get("/runs/new/?preset=paper").context["form"]

    assert sorted(row["values"]["region"] for row in form.island_rows) == [
        "us-central", "us-east", "us-south", "us-west"]


def test_the_new_run_form_shows_the_runs_sizes_from_the_estimate_endpoint(operator_client):
    content = operator_client.get("/runs/new/").content.decode()

    assert 'id="estimate" data-url="/api/config/estimate"' in content
    assert '<script type="module" src="/static/dashboard/new_run.js">' in content
    assert "Activations are an" in content
    # Each island's wire per outer step, filled in from the answer's `wire`.
    assert '<table id="estimate-wire">' in content
    assert "<th>up (MB)</th><th>down (MB)</th><th>up (s)</th><th>down (s)</th>" in content


def test_the_gpt2_small_preset_has_its_shape_and_about_85m_parameters(operator_client,
                                                                     settings):
    form = operator_client.get("/runs/new/?preset=gpt2_small").context["form"]
    config = preset_config("gpt2_small", settings.REGIONS)

    assert [form[f"model.{k}"].value() for k in ("n_layer", "n_embd", "n_head")] == [
        12, 768, 12]
    assert 85_000_000 < parameter_count(parse_config(config, settings.REGIONS).model) < 86_000_000


def test_the_new_run_form_creates_a_run_with_its_islands(operator_client, operator):
    data = form_data(operator_client, **{"sync.min_quorum": "3", "islands-1-batch_size": "4"})

    response = operator_client.post("/runs/new/", data)

    run = Run.objects.get()
    assert response.status_code == 302
    assert response["Location"] == f"/runs/{run.pk}/"
    assert (run.name, run.created_by, run.config["sync"]["min_quorum"]) == (
        "from the form", operator, 3)
    assert run.islands.count() == 4
    assert run.config["islands"][1]["batch_size"] == 4


def test_islands_removed_in_the_form_are_not_created(operator_client):
    data = form_data(operator_client, **{"sync.min_quorum": "1"})
    for key in [k for k in data if k.startswith(("islands-2-", "islands-3-"))]:
        del data[key]

    operator_client.post("/runs/new/", data)

    assert Run.objects.get().islands.count() == 2


def test_a_bad_setting_gets_its_message_beside_its_field_and_nothing_is_saved(operator_client):
    data = form_data(operator_client, **{"sync.min_quorum": "9", "model.n_head": "5",
                                         "optim.inner_lr": "fast"})

    response = operator_client.post("/runs/new/", data)

    errors = response.context["form"].errors
    assert response.status_code == 200
    assert errors["sync.min_quorum"] == [
        "Must be between 1 and the number of islands (4), got 9."]
    assert errors["model.n_head"] == ["Must divide model.n_embd (64), got 5."]
    assert errors["optim.inner_lr"] == ["Must be a number, got 'fast'."]
    assert not Run.objects.exists()


def test_a_bad_island_gets_its_message_in_its_row(operator_client):
    data = form_data(operator_client, **{"islands-2-speed": "-1", "islands-3-name": "",
                                         "islands-0-region": "mars"})

    response = operator_client.post("/runs/new/", data)

    rows = response.context["form"].island_rows
    assert rows[2]["errors"] == {"speed": ["Must be between 0.01 and 100, got -1."]}
    assert rows[3]["errors"] == {"name": ["This field is required."]}
    assert "got 'mars'" in rows[0]["errors"]["region"][0]
    assert b"got -1." in response.content
    assert not Run.objects.exists()


def test_name_and_mode_errors_are_shown_on_their_own_fields(operator_client):
    data = form_data(operator_client, name="", mode="synchronous")

    errors = operator_client.post("/runs/new/", data).context["form"].errors

    assert errors["name"] == ["This field is required."]
    assert "synchronous" in errors["mode"][0]


def test_the_form_refuses_a_post_without_its_csrf_token(operator):
    client = Client(enforce_csrf_checks=True)
    client.force_login(operator)

    response = client.post("/runs/new/", {"name": "forged"})

    assert response.status_code == 403
    assert not Run.objects.exists()


@pytest.fixture
def checkpoint(tmp_path):
    source = create_run(name="source", mode="decoupled", config={}, user=None)
    params = initial_model(source.run_config()).state_dict()
    path = tmp_path / "c.safetensors"
    sha, size = save(path, params, {}, [5, 5, 5, 5], 1000)
    return Checkpoint.objects.create(run=source, versions={}, outer_step=5, path=str(path),
                                     sha256=sha, bytes=size)


def test_new_run_from_here_starts_from_the_checkpoint_with_its_runs_settings(
        operator_client, checkpoint):
    path = f"/runs/new/?from={checkpoint.pk}"
    form = operator_client.get(path).context["form"]
    data = form_data(operator_client, path, name="continued")

    operator_client.post("/runs/new/", data)

    run = Run.objects.get(name="continued")
    assert form["initial_checkpoint"].value() == checkpoint.pk
    assert run.initial_checkpoint == checkpoint
    assert run.config["model"] == checkpoint.run.config["model"]


def test_a_checkpoint_of_another_model_shape_is_refused(operator_client, checkpoint):
    data = form_data(operator_client, initial_checkpoint=str(checkpoint.pk),
                     **{"model.n_embd": "32"})

    errors = operator_client.post("/runs/new/", data).context["form"].errors

    assert "model settings must be those of the checkpoint" in errors["initial_checkpoint"][0]


def test_the_run_page_shows_the_run_its_islands_their_map_and_timeline(viewer_client,
                                                                     settings):
    settings.SYNCD_REGION = "us-east"
    run = create_run(name="shown", mode="decoupled",
                     config={"islands": [{"name": "iceland", "region": "us-west"}],
                             "sync": {"min_quorum": 1}}, user=None)

    response = viewer_client.get(f"/runs/{run.pk}/")

    assert response.status_code == 200
    page = response.context["page"]
    assert page["run"]["islands"][0]["name"] == "iceland"
    assert page["map"]["regions"] == {"us-west": (-121.2, 45.6), "us-east": (-77.5, 39.0)}
    assert page["map"]["syncd"] == "us-east"
    assert page["map"]["topojson"] == "/static/dashboard/topojson/"
    assert [lane["island"] for lane in page["timeline"]["islands"]] == ["iceland"]
    assert page["can"] == {"operate": False, "fault": False, "edit": False, "delete": False,
                           "admin": False}
    assert b"plotly/plotly.min.js" in response.content


def test_the_run_page_offers_operators_their_buttons(operator_client):
    run = create_run(name="shown", mode="decoupled", config={}, user=None)

    response = operator_client.get(f"/runs/{run.pk}/")

    assert response.context["page"]["can"]["fault"] is True
    assert b'data-action="start"' in response.content


def test_the_run_page_names_states_faults_and_actions_as_the_models_do(viewer_client):
    run = create_run(name="shown", mode="decoupled", config={}, user=None)

    vocabulary = viewer_client.get(f"/runs/{run.pk}/").context["page"]["vocabulary"]

    assert list(vocabulary["actions"]) == Run.State.values
    assert vocabulary["actions"]["draft"] == ["start"]
    assert vocabulary["actions"]["running"] == ["pause", "checkpoint", "stop"]
    assert vocabulary["actions"]["paused"] == ["resume", "checkpoint", "stop"]
    assert vocabulary["actions"]["stopping"] == vocabulary["actions"]["completed"] == []
    assert vocabulary["under_way"] == ["queued", "running", "paused"]
    assert [f["kind"] for f in vocabulary["faults"]] == [
        "kill", *(kind for kind in Island.Fault.values if kind != Island.Fault.NONE)]
    assert [f["label"] for f in vocabulary["faults"] if not f["lasts"]] == [
        "Kill", "Corrupt next update"]


def test_a_run_name_with_html_is_shown_as_text(viewer_client):
    run = create_run(name="<script>alert(1)</script>", mode="decoupled", config={}, user=None)

    content = viewer_client.get(f"/runs/{run.pk}/").content.decode()

    assert "<script>alert(1)</script>" not in content
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in content


def test_the_run_page_shows_each_figure_with_the_help_of_its_status_field(viewer_client):
    run = create_run(name="shown", mode="decoupled", config={}, user=None)

    response = viewer_client.get(f"/runs/{run.pk}/")

    described = fields(RunStatus)
    assert [field for _, _, field in FIGURES] == [
        "goodput", "uptime", "startup_s", "train_loss", "eval_loss", "eval_bpb", "outer_steps",
        "tau", "versions", "alive_islands"]
    for label, element, field in FIGURES:
        assert f'<dt>{label}</dt><dd id="{element}" title="{described[field][1]}">'.replace(
            "'", "&#x27;") in response.content.decode()


def test_the_run_page_answers_404_for_a_missing_run(viewer_client):
    assert viewer_client.get("/runs/999999/").status_code == 404


def test_compare_overlays_the_chosen_runs_histories(viewer_client):
    runs = [create_run(name=n, mode=m, config={}, user=None)
            for n, m in (("d", "decoupled"), ("e", "elastic"))]
    for run in runs:
        Run.objects.filter(pk=run.pk).update(state=Run.State.COMPLETED)
        Metric.objects.create(run=run, tokens=100, outer_steps=1, train_loss=3.0)

    response = viewer_client.get(f"/compare/?runs={runs[0].pk}&runs={runs[1].pk}")

    series = response.context["series"]
    assert sorted((s["name"], s["mode"], len(s["metrics"])) for s in series) == [
        ("d", "decoupled", 1), ("e", "elastic", 1)]


def test_compare_overlays_the_newest_history_of_a_long_run(viewer_client):
    run = create_run(name="long", mode="decoupled", config={}, user=None)
    start = timezone.now() - timedelta(hours=3)
    Metric.objects.bulk_create(Metric(run=run, time=start + timedelta(seconds=i), tokens=i,
                                      outer_steps=i) for i in range(MAX_METRICS + 100))

    [series] = viewer_client.get(f"/compare/?runs={run.pk}").context["series"]

    assert len(series["metrics"]) == MAX_METRICS
    assert series["metrics"][-1]["tokens"] == MAX_METRICS + 99


def test_a_token_made_in_the_ui_is_shown_once_and_stored_hashed(viewer_client, viewer):
    response = viewer_client.post("/account/tokens/", {"name": "laptop"})

    token = response.context["made"]
    row = ApiToken.objects.get(user=viewer)
    assert token.startswith("arch_") and row.name == "laptop"
    assert token not in (row.key_hash, row.hint)
    assert ApiToken.authenticate(token) == viewer
    assert token not in viewer_client.get("/account/tokens/").content.decode()


def test_a_user_revokes_only_their_own_tokens(viewer_client, viewer, operator):
    mine, _ = ApiToken.issue(viewer)
    theirs, _ = ApiToken.issue(operator)

    ok = viewer_client.post(f"/account/tokens/{mine.pk}/revoke/")
    refused = viewer_client.post(f"/account/tokens/{theirs.pk}/revoke/")

    assert ok.status_code == 302 and refused.status_code == 404
    assert list(ApiToken.objects.all()) == [theirs]


def test_superusers_may_create_runs(client, django_user_model):
    client.force_login(django_user_model.objects.create_superuser("root", None, None))

    assert client.get("/runs/new/").status_code == 200


def test_the_run_page_charts_the_newest_points_of_a_long_run(viewer_client):
    """A run with more points than a page of history (MAX_METRICS) charts its newest
    CHART_POINTS, not the last of its oldest (a frozen chart after ~2.8 h)."""
    run = create_run(name="long", mode="decoupled", config={}, user=None)
    start = timezone.now() - timedelta(hours=3)
    Metric.objects.bulk_create(Metric(run=run, time=start + timedelta(seconds=i), tokens=i,
                                      outer_steps=i) for i in range(MAX_METRICS + 100))

    metrics = viewer_client.get(f"/runs/{run.pk}/").context["page"]["metrics"]

    assert len(metrics) == CHART_POINTS
    assert [p["tokens"] for p in metrics[-2:]] == [MAX_METRICS + 98, MAX_METRICS + 99]


def test_the_run_page_lists_the_newest_events_of_a_long_run(viewer_client):
    """A run with more events than a page of them (MAX_EVENTS: a few hours of merges)
    lists its newest EVENT_ROWS, not the last of its oldest."""
    run = create_run(name="long", mode="decoupled", config={}, user=None)
    Event.objects.bulk_create(Event(run=run, kind="merge", detail={"version": i})
                              for i in range(MAX_EVENTS + 100))

    events = viewer_client.get(f"/runs/{run.pk}/").context["page"]["events"]

    assert len(events) == EVENT_ROWS
    assert [e["detail"]["version"] for e in events[-2:]] == [MAX_EVENTS + 98, MAX_EVENTS + 99]


def test_the_run_page_charts_held_out_loss_against_merged_tokens_from_its_history(
        viewer_client):
    """A reload redraws the chart: the history keeps each evaluation with its tokens."""
    run = create_run(name="learning", mode="decoupled", config={}, user=None)
    start = timezone.now() - timedelta(minutes=1)
    Metric.objects.bulk_create([
        Metric(run=run, time=start, tokens=900, outer_steps=1),
        Metric(run=run, time=start + timedelta(seconds=2), tokens=2000, outer_steps=2,
               eval_loss=3.0, eval_tokens=1024, eval_bpb=4.328)])

    response = viewer_client.get(f"/runs/{run.pk}/")

    assert b'id="chart-eval"' in response.content
    evaluated = [(p["eval_tokens"], p["eval_loss"], p["eval_bpb"])
                 for p in response.context["page"]["metrics"] if p["eval_loss"] is not None]
    assert evaluated == [(1024, 3.0, 4.328)]
