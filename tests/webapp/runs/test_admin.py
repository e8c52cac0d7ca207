"""The admin's pages of runs (webapp.runs.admin): runs to look at, never their secret;
nothing added there, and records that syncd writes never changed there."""

import pytest

from webapp.runs.models import Checkpoint, Event, Island, Run
from webapp.runs.services import create_run

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
