"""The admin's pages of runs (webapp.runs.admin): runs to look at, never their secret;
nothing added there, records that syncd writes never changed there, and runs deleted
there only as the service deletes them."""

import pytest
from django.contrib.admin.models import DELETION, LogEntry

from syncd.connection import connect
from webapp.runs.lifecycle import create_run
from webapp.runs.models import Checkpoint, Event, Island, Run

pytestmark = pytest.mark.django_db


@pytest.fixture
def root(client, django_user_model):
    client.force_login(django_user_model.objects.create_superuser("root", None, None))
    return client


def test_the_admin_never_shows_the_run_secret(client, django_user_model):
    admin = django_user_model.objects.create_superuser("root", "root@example.com", None)
    client.force_login(admin)
    run = create_run(name="guarded", mode="decoupled", config={}, user=None)

    change_page = client.get(f"/admin/runs/run/{run.pk}/change/")
    list_page = client.get("/admin/runs/run/")

    assert change_page.status_code == 200 and list_page.status_code == 200
    assert b"guarded" in list_page.content
    assert run.secret.encode() not in change_page.content
    assert run.secret.encode() not in list_page.content


@pytest.mark.parametrize("model", ["run", "checkpoint", "event"])
def test_no_run_or_record_is_added_in_the_admin(root, model):
    assert root.get(f"/admin/runs/{model}/add/").status_code == 403


def test_a_runs_state_and_config_cannot_be_changed_in_the_admin(root):
    run = Run.objects.create(name="kept", mode="decoupled", config={"islands": []},
                             state=Run.State.RUNNING)
    Island.objects.create(run=run, name="a", region="us-east")

    root.post(f"/admin/runs/run/{run.pk}/change/",
              {"name": "renamed", "state": "completed", "config": "{}",
               "islands-TOTAL_FORMS": "1", "islands-INITIAL_FORMS": "1"})

    run.refresh_from_db()
    assert (run.state, run.config) == (Run.State.RUNNING, {"islands": []})


def test_events_and_checkpoints_are_shown_but_not_changed(root):
    run = Run.objects.create(name="kept", mode="decoupled", config={})
    event = Event.objects.create(run=run, kind=Event.Kind.MERGE, detail={"fragment": 0})
    checkpoint = Checkpoint.objects.create(run=run, outer_step=1, path="/nowhere",
                                           sha256="0" * 64, bytes=1)

    assert root.get("/admin/runs/event/").status_code == 200
    for url in (f"/admin/runs/event/{event.pk}/change/",
                f"/admin/runs/checkpoint/{checkpoint.pk}/change/"):
        page = root.get(url)
        assert page.status_code == 200 and b'name="_save"' not in page.content


def finished_run(name, redis_url, tmp_path):
    """A completed run with a checkpoint file and the Redis keys a run keeps when it ends."""
    run = Run.objects.create(name=name, mode="decoupled", config={},
                             state=Run.State.COMPLETED)
    path = tmp_path / f"{name}.safetensors"
    path.write_bytes(b"weights")
    Checkpoint.objects.create(run=run, outer_step=1, path=str(path), sha256="0" * 64, bytes=7)
    client = connect(redis_url)
    client.set(f"arch:{run.pk}:status", "{}")
    client.set(f"arch:{run.pk}:log:east", "the last lines")
    return run, path


def lasting_keys(redis_url, run):
    """The run's Redis keys that never expire (those of a deleted run expire in a minute)."""
    client = connect(redis_url)
    return [key for key in client.keys(f"arch:{run.pk}:*") if client.ttl(key) == -1]


def messages_of(response):
    return [str(m) for m in response.context["messages"]]


def test_a_run_deleted_in_the_admin_goes_with_its_checkpoint_files_and_redis_keys(
        root, redis_url, tmp_path, django_capture_on_commit_callbacks):
    run, path = finished_run("done", redis_url, tmp_path)
    depended = Checkpoint.objects.create(run=run, outer_step=2, path=str(tmp_path / "kept"),
                                         sha256="1" * 64, bytes=1)
    (tmp_path / "kept").write_bytes(b"weights")
    Run.objects.create(name="child", mode="decoupled", config={}, initial_checkpoint=depended)

    with django_capture_on_commit_callbacks(execute=True):
        response = root.post(f"/admin/runs/run/{run.pk}/delete/", {"post": "yes"})

    assert response.status_code == 302
    assert not Run.objects.filter(pk=run.pk).exists()
    assert list(Checkpoint.objects.values_list("pk", flat=True)) == [depended.pk]
    assert not path.exists() and (tmp_path / "kept").exists()
    assert lasting_keys(redis_url, run) == []


def test_the_admin_refuses_to_delete_a_live_run_and_says_why(root, running):
    response = root.post(f"/admin/runs/run/{running.pk}/delete/", {"post": "yes"},
                         follow=True)

    assert response.redirect_chain[-1][0] == f"/admin/runs/run/{running.pk}/change/"
    [message] = messages_of(response)
    assert message.startswith("'running' was not deleted: cannot delete a run")
    assert Run.objects.filter(pk=running.pk).exists()
    assert not LogEntry.objects.filter(action_flag=DELETION).exists()


def test_a_bulk_delete_in_the_admin_goes_through_the_service(
        root, redis_url, tmp_path, django_capture_on_commit_callbacks):
    runs = [finished_run(name, redis_url, tmp_path) for name in ("one", "two")]
    selected = {"action": "delete_selected", "_selected_action": [run.pk for run, _ in runs]}

    confirmation = root.post("/admin/runs/run/", selected)
    assert confirmation.status_code == 200 and b"Are you sure" in confirmation.content
    assert Run.objects.count() == 2

    with django_capture_on_commit_callbacks(execute=True):
        response = root.post("/admin/runs/run/", {**selected, "post": "yes"}, follow=True)

    assert messages_of(response) == ["Successfully deleted 2 runs."]
    assert not Run.objects.exists() and not Checkpoint.objects.exists()
    for run, path in runs:
        assert not path.exists() and lasting_keys(redis_url, run) == []


def test_a_bulk_delete_with_a_live_run_deletes_none_and_says_why(
        root, running, redis_url, tmp_path, django_capture_on_commit_callbacks):
    done, path = finished_run("done", redis_url, tmp_path)

    with django_capture_on_commit_callbacks(execute=True):
        response = root.post("/admin/runs/run/", {
            "action": "delete_selected", "post": "yes",
            "_selected_action": [done.pk, running.pk]}, follow=True)

    [message] = messages_of(response)
    assert message.startswith("No run was deleted. 'running' was not deleted: cannot delete")
    assert Run.objects.filter(pk__in=[done.pk, running.pk]).count() == 2
    assert path.exists() and lasting_keys(redis_url, done) != []
    assert not LogEntry.objects.filter(action_flag=DELETION).exists()
