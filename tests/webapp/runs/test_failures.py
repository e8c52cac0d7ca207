"""An island that fails on its own leaves an alert (webapp/runs/failures.py)."""

import pytest

from webapp.runs.failures import record_island_failure
from webapp.runs.models import Event

pytestmark = [pytest.mark.django_db, pytest.mark.integration]


def test_a_crashed_island_leaves_an_alert_saying_why(running):
    record_island_failure(running.pk, "east-a", {"epoch": 1, "exit_code": 1,
                                                 "log_tail": ["Traceback ...", "OSError: disk"]})
    alert = Event.objects.get(run=running, kind="alert")
    assert alert.island.name == "east-a"
    assert "exit code 1" in alert.detail["message"]
    assert alert.detail["log"][-1] == "OSError: disk"
