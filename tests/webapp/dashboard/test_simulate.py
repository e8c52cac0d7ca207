"""The Simulate page: sweeps of the datacenter simulator as Celery tasks on the control
queue, their progress pushed to the page."""

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator

from webapp.dashboard.consumers import SimulationConsumer
from webapp.runs.models import Simulation
from webapp.runs.simulations import check_sweep, run_simulation_now

pytestmark = pytest.mark.django_db


@pytest.fixture
def queued(monkeypatch):
    from webapp.runs.tasks import run_simulation

    sent = []
    monkeypatch.setattr(run_simulation, "apply_async",
                        lambda args=None, **options: sent.append((args, options)))
    return sent


def test_viewers_see_the_page_but_may_not_start_a_sweep(viewer_client, queued):
    page = viewer_client.get("/simulate/")
    refused = viewer_client.post("/simulate/", {"chips": "150000", "islands": "1",
                                                "hours": "1"})

    assert page.status_code == 200 and b"simulate-form" not in page.content
    assert refused.status_code == 403
    assert not Simulation.objects.exists() and queued == []


def test_an_operator_starts_a_sweep_on_the_control_queue(operator_client, queued):
    response = operator_client.post("/simulate/", {"chips": "150000, 1200000",
                                                   "islands": "8, 1", "hours": "2",
                                                   "knobs": "on"})

    simulation = Simulation.objects.get()
    assert response.status_code == 302
    assert response["Location"] == f"/simulate/?id={simulation.pk}"
    assert simulation.spec == {"chips": [150000, 1200000], "islands": [1, 8],
                               "duration_s": 7200.0, "knobs": True}
    assert queued == [([simulation.pk], {"queue": "control"})]


@pytest.mark.parametrize(("field", "value", "message"), [
    ("chips", "many", "Must be numbers, got 'many'."),
    ("chips", "10", "Each must be between 1000 and 5e+06, got 10."),
    ("islands", "", "Give 1 to 10 numbers, separated by commas."),
    ("hours", "100", "Each must be between 0.1 and 24, got 100."),
])
def test_a_bad_sweep_gets_its_message_beside_the_field(operator_client, queued, field, value,
                                                       message):
    data = {"chips": "150000", "islands": "1", "hours": "1", field: value}

    response = operator_client.post("/simulate/", data)

    assert response.status_code == 200
    assert response.context["errors"][field] == message
    assert not Simulation.objects.exists()


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_the_page_gets_the_simulation_then_its_updates(viewer, operator, channel_layer):
    sweep = check_sweep({"chips": [150000], "islands": [2], "hours": 0.1, "knobs": False})
    simulation = Simulation.objects.create(spec=sweep, created_by=operator)
    com = WebsocketCommunicator(SimulationConsumer.as_asgi(), f"/ws/simulations/{simulation.pk}/")
    com.scope["user"] = viewer
    com.scope["url_route"] = {"kwargs": {"simulation_id": simulation.pk}}

    async def session() -> list[dict]:
        from asgiref.sync import sync_to_async

        await com.connect()
        got = [await com.receive_json_from()]
        await sync_to_async(run_simulation_now)(simulation.pk)
        while got[-1]["simulation"]["state"] != "completed":
            got.append(await com.receive_json_from(timeout=30))
        await com.disconnect()
        return got

    got = async_to_sync(session)()
    states = [m["simulation"]["state"] for m in got]
    assert states[0] == "queued" and states[-1] == "completed"
    assert "running" in states
    assert got[-1]["simulation"]["result"]["goodput_table"]


def test_a_benchmark_report_is_served_to_signed_in_users(viewer_client, client, settings,
                                                         tmp_path):
    settings.BENCH_RESULTS_DIR = tmp_path
    (tmp_path / "goodput.html").write_text("<html>goodput figures</html>")

    shown = viewer_client.get("/reports/goodput/")
    anonymous = client.get("/reports/goodput/")

    assert shown.status_code == 200 and b"goodput figures" in b"".join(shown.streaming_content)
    assert anonymous.status_code == 302


@pytest.mark.parametrize("name", ["simulate", "../settings", "quality"])
def test_a_report_that_is_missing_or_not_a_report_is_404(viewer_client, settings, tmp_path,
                                                         name):
    settings.BENCH_RESULTS_DIR = tmp_path
    (tmp_path / "quality.html").write_text("not offered")

    assert viewer_client.get(f"/reports/{name}/").status_code == 404
