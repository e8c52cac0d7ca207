"""/api/runs (webapp/api/runs.py): list, create, read, archive, delete, start, stop,
pause, resume, checkpoint, history, events and the config schema; with the error shape
of each."""

import json
import math
import time
from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from diloco.config import field_help
from syncd.connection import connect
from syncd.store import RunStore
from webapp.runs import lifecycle
from webapp.runs.lifecycle import create_run
from webapp.runs.models import Checkpoint, Event, Metric, Run

pytestmark = pytest.mark.django_db

RUNS = "/api/runs"


def test_it_lists_runs_with_their_live_figures_and_without_their_secrets(viewer_api, draft):
    response = viewer_api.get(RUNS)

    assert response.status_code == 200
    data = response.json()
    assert data["count"] == 1
    [listed] = data["runs"]
    assert (listed["id"], listed["name"], listed["state"]) == (draft.pk, "draft", "draft")
    assert [i["name"] for i in listed["islands"]] == ["east-a", "east-b", "west-a"]
    assert listed["versions"] == {}
    assert listed["goodput"] is None
    assert draft.secret not in response.content.decode()


def test_it_lists_archived_runs_only_when_asked(viewer_api, redis_url):
    shown = create_run(name="shown", mode="decoupled", config={}, user=None)
    hidden = create_run(name="hidden", mode="decoupled", config={}, user=None)
    Run.objects.filter(pk=hidden.pk).update(archived=True)

    default = viewer_api.get(RUNS).json()["runs"]
    archived = viewer_api.get(RUNS, archived="true").json()["runs"]

    assert [r["id"] for r in default] == [shown.pk]
    assert [r["id"] for r in archived] == [hidden.pk]


def test_it_filters_orders_and_pages_the_list(viewer_api, redis_url):
    for name in ("b", "a", "c"):
        create_run(name=name, mode="elastic" if name == "c" else "decoupled", config={},
                   user=None)

    by_name = viewer_api.get(RUNS, ordering="name").json()
    elastic = viewer_api.get(RUNS, mode="elastic").json()
    page = viewer_api.get(RUNS, ordering="name", limit=1, offset=1).json()

    assert [r["name"] for r in by_name["runs"]] == ["a", "b", "c"]
    assert [r["name"] for r in elastic["runs"]] == ["c"]
    assert (page["count"], [r["name"] for r in page["runs"]]) == (3, ["b"])


def test_it_refuses_an_unknown_ordering(viewer_api):
    response = viewer_api.get(RUNS, ordering="secret")

    assert response.status_code == 422
    assert "ordering" in response.json()["errors"]


def test_it_creates_a_run_as_a_draft(operator_api, operator, redis_url):
    body = {"name": "api run", "mode": "elastic", "config": {"sync": {"min_quorum": 1}}}

    response = operator_api.post(RUNS, body)

    assert response.status_code == 201
    data = response.json()
    run = Run.objects.get()
    assert data["id"] == run.pk
    assert response["Location"] == f"/api/runs/{run.pk}"
    assert (data["name"], data["mode"], data["state"]) == ("api run", "elastic", "draft")
    assert data["config"]["sync"]["min_quorum"] == 1
    assert [i["name"] for i in data["islands"]] == ["island-0", "island-1"]
    assert "secret" not in data
    assert run.created_by == operator


def test_a_run_made_with_a_token_is_the_token_owners(api_for, token_for, operator, redis_url):
    api = api_for(None, **token_for(operator))

    response = api.post(RUNS, {"name": "by token", "mode": "decoupled", "config": {}})

    assert response.status_code == 201
    assert response.json()["created_by"] == "otto"
    assert Run.objects.get().created_by == operator


def test_it_starts_a_run_from_a_checkpoint(operator_api, checkpoint):
    body = {"name": "fine-tune", "mode": "decoupled", "config": {},
            "initial_checkpoint": checkpoint.pk}

    response = operator_api.post(RUNS, body)

    assert response.status_code == 201
    assert response.json()["initial_checkpoint"] == checkpoint.pk


def test_a_null_model_beside_a_checkpoint_takes_the_defaults_instead_of_a_500(
        operator_api, checkpoint):
    body = {"name": "r", "mode": "decoupled", "config": {"model": None},
            "initial_checkpoint": checkpoint.pk}

    response = operator_api.post(RUNS, body)

    assert response.status_code == 201  # the checkpoint's run has the default model


def test_it_refuses_a_checkpoint_whose_run_was_deleted(operator_api, checkpoint):
    Checkpoint.objects.filter(pk=checkpoint.pk).update(run=None)
    body = {"name": "r", "mode": "decoupled", "config": {}, "initial_checkpoint": checkpoint.pk}

    response = operator_api.post(RUNS, body)

    assert response.status_code == 422
    assert "run was deleted" in response.json()["errors"]["initial_checkpoint"][0]


def test_it_refuses_a_checkpoint_that_does_not_exist(operator_api):
    body = {"name": "r", "mode": "decoupled", "config": {}, "initial_checkpoint": 999999}

    response = operator_api.post(RUNS, body)

    assert response.status_code == 422
    assert response.json() == {"errors": {"initial_checkpoint": [
        "No checkpoint with id 999999."]}}


def test_it_rejects_min_quorum_above_island_count_keyed_by_dotted_path(operator_api):
    body = {"name": "r", "mode": "decoupled", "config": {"sync": {"min_quorum": 6}}}

    response = operator_api.post(RUNS, body)

    assert response.status_code == 422
    assert response.json() == {"errors": {"sync.min_quorum": [
        "Must be between 1 and the number of islands (2), got 6."]}}
    assert not Run.objects.exists()


def test_it_creates_a_run_of_a_trained_tokenizer_on_a_json_lines_corpus(operator_api,
                                                                        data_root):
    corpus = data_root / "docs.jsonl"
    corpus.write_text("".join(json.dumps({"body": f"document {i} " * 20}) + "\n"
                              for i in range(500)))
    data = {"path": str(corpus), "tokenizer": "train", "vocab_size": 512,
            "text_field": "body"}
    body = {"name": "bpe", "mode": "decoupled", "config": {"data": data}}

    response = operator_api.post(RUNS, body)

    assert response.status_code == 201
    assert response.json()["config"]["data"] == {**data, "eval_fraction": 0.05}


@pytest.mark.parametrize(("data", "key"), [
    ({"tokenizer": "missing-folder"}, "data.tokenizer"),
    ({"tokenizer": "train", "vocab_size": 10}, "data.vocab_size"),
    ({"text_field": 3}, "data.text_field"),
])
def test_it_refuses_a_bad_tokenizer_setting_at_its_field(operator_api, data_root, data, key):
    folder = data_root / "missing-folder"
    data = {**data, "tokenizer": str(folder)} if data.get("tokenizer") == folder.name else data
    body = {"name": "r", "mode": "decoupled", "config": {"data": data}}

    response = operator_api.post(RUNS, body)

    assert response.status_code == 422
    assert list(response.json()["errors"]) == [key]
    assert not Run.objects.exists()


def test_it_reports_name_and_mode_errors_beside_config_errors(operator_api):
    body = {"name": "", "mode": "x", "config": {"islands": [{"name": "a", "region": "mars"}]}}

    response = operator_api.post(RUNS, body)

    assert response.status_code == 422
    errors = response.json()["errors"]
    assert set(errors) == {"name", "mode", "islands.0.region", "sync.min_quorum"}
    assert errors["name"] == ["This field is required."]
    assert errors["mode"] == ["Must be one of decoupled, sync, elastic, got 'x'."]


def test_it_refuses_a_config_put_at_the_top_level(operator_api):
    response = operator_api.post(RUNS, {"name": "r", "mode": "decoupled", "sync": {}})

    assert response.status_code == 422
    assert response.json() == {"errors": {"sync": [
        "Unknown field; expected name, mode, config, initial_checkpoint "
        "(the run config goes under config)."]}}


def test_it_refuses_a_config_that_is_not_an_object(operator_api):
    response = operator_api.post(RUNS, {"name": "r", "mode": "decoupled", "config": [1]})

    assert response.status_code == 422
    assert response.json()["errors"]["config"] == [
        "Input should be a valid dictionary, got [1]."]


def test_it_shows_one_run_with_the_fields_of_the_contract(viewer_api, running):
    response = viewer_api.get(f"{RUNS}/{running.pk}")

    assert response.status_code == 200
    data = response.json()
    assert {"id", "name", "mode", "state", "config", "islands", "versions", "outer_steps",
            "tokens", "goodput", "uptime", "train_loss", "eval_loss"} <= set(data)
    assert data["state"] == "running"
    assert {"name", "region", "state", "fault", "tokens", "version_lag"} \
        <= set(data["islands"][0])
    assert "secret" not in data


def test_it_shows_syncds_live_status(viewer_api, running, redis_url):
    store = RunStore(connect(redis_url), running.pk)
    store.client.set(store.key("status"), json.dumps({
        "versions": [7, 6], "outer_steps": 6, "goodput": 0.9, "uptime": 1.0,
        "train_loss": 2.5, "eval_loss": 2.7,
        "islands": {"east-a": {"state": "lost", "fault": "partition", "version_lag": 2}}}))
    # Tokens and outer steps are the Run row's, which syncd keeps current.
    Run.objects.filter(pk=running.pk).update(tokens=1000, outer_steps=6)

    data = viewer_api.get(f"{RUNS}/{running.pk}").json()

    assert data["versions"] == {"0": 7, "1": 6}
    assert (data["outer_steps"], data["goodput"], data["eval_loss"]) == (6, 0.9, 2.7)
    assert data["tokens"] == 1000 and data["progress"] == pytest.approx(
        1000 / running.config["budget"]["total_tokens"])
    east_a = data["islands"][0]
    assert (east_a["state"], east_a["fault"], east_a["version_lag"]) == \
        ("lost", "partition", 2)


def test_it_answers_404_in_json_for_a_missing_run(viewer_api):
    response = viewer_api.get(f"{RUNS}/999999")

    assert response.status_code == 404
    assert response.json() == {"errors": {"run": ["No run with id 999999."]}}


def test_it_answers_422_for_a_run_id_that_is_not_a_number(viewer_api):
    response = viewer_api.get(f"{RUNS}/first")

    assert response.status_code == 422
    assert list(response.json()["errors"]) == ["run_id"]


def test_an_operator_can_archive_a_run_and_bring_it_back(operator_api, draft):
    archived = operator_api.patch(f"{RUNS}/{draft.pk}", {"archived": True})
    draft.refresh_from_db()
    was_archived = draft.archived
    shown = operator_api.patch(f"{RUNS}/{draft.pk}", {"archived": False})
    draft.refresh_from_db()

    assert archived.status_code == shown.status_code == 200
    assert archived.json()["archived"] is True
    assert was_archived and not draft.archived


@pytest.mark.parametrize("body, key", [
    ({}, "archived"),
    ({"archived": "maybe"}, "archived"),
    ({"archived": True, "name": "renamed"}, "name"),
])
def test_it_refuses_a_bad_patch(operator_api, draft, body, key):
    response = operator_api.patch(f"{RUNS}/{draft.pk}", body)

    assert response.status_code == 422
    assert list(response.json()["errors"]) == [key]


def test_an_operator_can_delete_a_draft(operator_api, draft):
    response = operator_api.delete(f"{RUNS}/{draft.pk}")

    assert response.status_code == 204
    assert not Run.objects.exists()


def test_it_refuses_to_delete_a_running_run_with_409(operator_api, running):
    response = operator_api.delete(f"{RUNS}/{running.pk}")

    assert response.status_code == 409
    [message] = response.json()["errors"]["state"]
    assert message.startswith("cannot delete a run") and "running" in message
    assert Run.objects.filter(pk=running.pk).exists()


@pytest.fixture
def starts(monkeypatch):
    """The rest of each start the API queues for the control worker, recorded instead
    of sent: (run id, user id, again)."""
    from webapp.runs.starting import finish_start_task

    queued: list[dict] = []
    monkeypatch.setattr(finish_start_task, "apply_async",
                        lambda args=None, **options: queued.append({"args": args, **options}))
    return queued


def test_a_start_answers_at_once_with_202_and_the_control_worker_starts_the_islands(
        operator_api, draft, enqueued, starts, operator, settings):
    from syncd.pool_store import PoolStore
    from webapp.runs.starting import finish_start_task

    # A pool that never fills: the old start waited this long inside the request.
    settings.ISLAND_POOL_FILL_WAIT_S = 30
    PoolStore(connect(settings.REDIS_URL)).put_host("us-east", "host-1", {
        "ready": 0, "size": 3, "time": time.time()})
    began = time.monotonic()
    response = operator_api.post(f"{RUNS}/{draft.pk}/start")

    assert time.monotonic() - began < 10
    assert response.status_code == 202
    assert response["Location"] == f"/api/runs/{draft.pk}"
    assert response.json()["state"] == "queued"
    assert response.json()["start_progress"] == "queued"
    assert enqueued == []
    assert starts == [{"args": [draft.pk, operator.pk, False], "queue": "control"}]

    settings.ISLAND_POOL_FILL_WAIT_S = 0
    finish_start_task(*starts[0]["args"])  # as the control worker does

    shown = operator_api.get(f"{RUNS}/{draft.pk}").json()
    assert shown["state"] == "running" and shown["start_progress"] == "started"
    assert [task["args"][1] for task in enqueued] == ["east-a", "east-b", "west-a"]
    assert Event.objects.filter(run=draft, kind="run_state").count() == 2


def test_a_run_stopped_while_its_pools_fill_starts_no_island(
        operator_api, draft, enqueued, starts, settings):
    from webapp.runs.starting import finish_start_task

    operator_api.post(f"{RUNS}/{draft.pk}/start")
    assert operator_api.post(f"{RUNS}/{draft.pk}/stop").status_code == 200

    finish_start_task(*starts[0]["args"])

    draft.refresh_from_db()
    assert draft.state == Run.State.STOPPING and enqueued == []


def test_starting_a_running_run_is_a_409_that_says_why(operator_api, running):
    response = operator_api.post(f"{RUNS}/{running.pk}/start")

    assert response.status_code == 409
    assert response.json() == {"errors": {"state": [
        "cannot go from running to queued (from running a run can go to completed, "
        "failed, paused, stopping)"]}}


def test_a_value_error_of_a_service_is_a_500_not_a_state_conflict(operator_api, running,
                                                                   monkeypatch):
    def broken(run, by):
        raise ValueError("a bug in the service")

    monkeypatch.setattr(lifecycle, "pause_run", broken)

    with pytest.raises(ValueError, match="a bug in the service"):  # Django's 500
        operator_api.post(f"{RUNS}/{running.pk}/pause")


# A stop leaves the run stopping: syncd merges what arrives, checkpoints, then stops it.
@pytest.mark.parametrize("action, state", [("pause", "paused"), ("stop", "stopping")])
def test_an_operator_can_pause_and_stop_a_running_run(operator_api, running, action, state):
    response = operator_api.post(f"{RUNS}/{running.pk}/{action}")

    assert response.status_code == 200
    assert response.json()["state"] == state


def test_an_operator_can_resume_a_paused_run(operator_api, paused):
    response = operator_api.post(f"{RUNS}/{paused.pk}/resume")

    assert response.status_code == 200
    assert response.json()["state"] == "running"


def test_a_checkpoint_request_reaches_syncd(operator_api, running, redis_url):
    response = operator_api.post(f"{RUNS}/{running.pk}/checkpoint")

    assert response.status_code == 202
    assert Event.objects.filter(run=running, kind="checkpoint",
                                detail__requested=True).exists()


def test_a_draft_cannot_be_checkpointed(operator_api, draft):
    response = operator_api.post(f"{RUNS}/{draft.pk}/checkpoint")

    assert response.status_code == 409
    assert "state" in response.json()["errors"]


def test_the_history_starts_after_since(viewer_api, draft):
    now = timezone.now()
    for minutes in (3, 2, 1):
        Metric.objects.create(run=draft, time=now - timedelta(minutes=minutes),
                              tokens=100 * minutes, outer_steps=minutes, versions=[minutes])

    everything = viewer_api.get(f"{RUNS}/{draft.pk}/metrics").json()["metrics"]
    recent = viewer_api.get(f"{RUNS}/{draft.pk}/metrics",
                            since=(now - timedelta(minutes=2, seconds=30)).isoformat())
    naive = viewer_api.get(f"{RUNS}/{draft.pk}/metrics",
                           since=(now - timedelta(minutes=1, seconds=30))
                           .replace(tzinfo=None).isoformat())

    assert [m["outer_steps"] for m in everything] == [3, 2, 1]
    assert [m["outer_steps"] for m in recent.json()["metrics"]] == [2, 1]
    assert [m["outer_steps"] for m in naive.json()["metrics"]] == [1]


def test_it_refuses_a_since_that_is_not_a_time(viewer_api, draft):
    response = viewer_api.get(f"{RUNS}/{draft.pk}/metrics", since="yesterday")

    assert response.status_code == 422
    assert list(response.json()["errors"]) == ["since"]


def test_the_events_come_after_an_id_and_of_a_kind(viewer_api, running):
    first = Event.objects.filter(run=running).order_by("id").first()
    Event.objects.create(run=running, kind=Event.Kind.ALERT, detail={"message": "m"})

    after = viewer_api.get(f"{RUNS}/{running.pk}/events", after=first.pk).json()["events"]
    alerts = viewer_api.get(f"{RUNS}/{running.pk}/events", kind="alert").json()["events"]

    assert all(e["id"] > first.pk for e in after)
    assert [e["kind"] for e in alerts] == ["alert"]
    assert alerts[0]["detail"] == {"message": "m"}


def test_it_refuses_an_event_kind_outside_the_vocabulary(viewer_api, draft):
    response = viewer_api.get(f"{RUNS}/{draft.pk}/events", kind="explosion")

    assert response.status_code == 422
    [message] = response.json()["errors"]["kind"]
    assert message.startswith("Must be 'run_state', 'merge', ")
    assert message.endswith("'alert', got explosion.")


def test_the_schema_gives_defaults_and_help(viewer_api):
    response = viewer_api.get("/api/config/schema")

    assert response.status_code == 200
    data = response.json()
    assert data["defaults"]["sync"]["min_quorum"] == 2
    assert data["help"] == field_help()
    assert data["modes"] == ["decoupled", "sync", "elastic"]
    assert data["regions"] == settings.REGIONS


def test_an_old_path_with_a_trailing_slash_gets_a_json_404_that_says_so(viewer_api):
    response = viewer_api.get("/api/runs/")

    assert response.status_code == 404
    [message] = response.json()["errors"]["path"]
    assert "no trailing slash: /api/runs." in message


def test_a_nan_figure_is_answered_as_null(viewer_api, running, redis_url):
    store = RunStore(connect(redis_url), running.pk)
    store.client.set(store.key("status"), json.dumps({"versions": [1, 1], "eval_loss": math.nan,
                                                      "goodput": math.inf}))

    response = viewer_api.get(f"{RUNS}/{running.pk}")

    assert b"NaN" not in response.content and b"Infinity" not in response.content
    assert response.json()["eval_loss"] is None
