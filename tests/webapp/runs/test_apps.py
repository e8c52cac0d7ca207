"""The runs app (webapp.runs.apps): once ready, every event saved is pushed to the
run's live pages after its transaction commits."""

import pytest

from webapp.runs import live
from webapp.runs.models import Event, Run

pytestmark = pytest.mark.django_db


def test_a_new_event_is_pushed_once_its_transaction_commits(monkeypatch,
                                                            django_capture_on_commit_callbacks):
    pushed = []
    monkeypatch.setattr(live, "push_events", lambda run_id, events: pushed.append(
        (run_id, [e.kind for e in events])))
    run = Run.objects.create(name="r", mode="decoupled", config={})

    with django_capture_on_commit_callbacks(execute=True):
        event = Event.objects.create(run=run, kind=Event.Kind.MERGE)
        assert pushed == []

    assert pushed == [(run.pk, ["merge"])]
    with django_capture_on_commit_callbacks(execute=True):
        event.save()  # saved again, not new: not pushed again
    assert len(pushed) == 1
