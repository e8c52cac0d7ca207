"""Islands and faults through the API (webapp/api/islands.py): list, add, remove,
rejoin, log; kill, straggle, partition, degrade, corrupt an island; a region outage;
kill syncd."""

import json

import pytest

from syncd.connection import connect
from syncd.store import RunStore
from trainer.island_logs import island_log_path
from webapp.runs.faults import MAX_FAULT_SECONDS
from webapp.runs.models import Event, Island

pytestmark = [pytest.mark.django_db, pytest.mark.integration]


def islands_of(run) -> str:
    return f"/api/runs/{run.pk}/islands"


def faults_of(run, island: str = "east-a") -> str:
    return f"/api/runs/{run.pk}/islands/{island}/faults"


def test_it_lists_the_islands_with_their_live_state(viewer_api, running):
    response = viewer_api.get(islands_of(running))

    assert response.status_code == 200
    islands = response.json()["islands"]
    assert [(i["name"], i["region"]) for i in islands] == [
        ("east-a", "us-east"), ("east-b", "us-east"), ("west-a", "us-west")]
    assert {"state", "fault", "tokens", "version_lag", "epoch"} <= set(islands[0])



def test_each_island_shows_its_step_time_and_share_of_its_hosts_cpu(viewer_api, running,
                                                                    redis_url):
    RunStore(connect(redis_url), running.pk).put_status({"islands": {
        "east-a": {"state": "training", "step_time_s": 0.1, "cpu_share": 0.0625},
        "east-b": {"state": "training", "step_time_s": 0.5, "cpu_share": 0.02}}})

    listed = viewer_api.get(islands_of(running)).json()["islands"]
    detail = viewer_api.get(f"/api/runs/{running.pk}").json()["islands"]

    for islands in (listed, detail):
        figures = {i["name"]: (i["step_time_s"], i["cpu_share"]) for i in islands}
        # west-a has no live figures yet.
        assert figures == {"east-a": (0.1, 0.0625), "east-b": (0.5, 0.02),
                           "west-a": (None, None)}


def test_each_island_shows_the_seconds_it_waited_for_merges_and_for_upload_slots(
        viewer_api, running, redis_url):
    RunStore(connect(redis_url), running.pk).put_status({"islands": {
        "east-a": {"state": "training", "backpressure_wait_s": 2.5, "slot_wait_s": 0.75}}})

    islands = viewer_api.get(islands_of(running)).json()["islands"]

    waits = {i["name"]: (i["backpressure_wait_s"], i["slot_wait_s"]) for i in islands}
    assert waits == {"east-a": (2.5, 0.75), "east-b": (0.0, 0.0), "west-a": (0.0, 0.0)}


def test_each_island_has_its_link_to_syncd_from_the_live_status(viewer_api, running,
                                                                redis_url):
    link = {"state": "degraded", "bytes_up": 1200.0, "bytes_down": 5000.0}
    RunStore(connect(redis_url), running.pk).put_status(
        {"islands": {"east-a": {"state": "training", "fault": "degrade", "link": link}}})

    islands = viewer_api.get(islands_of(running)).json()["islands"]

    assert islands[0]["link"] == link
    # No live status yet: the link follows the island's own state.
    assert islands[1]["link"] == {"state": "down", "bytes_up": 0, "bytes_down": 0}


def test_an_operator_can_add_an_island_to_a_running_run(operator_api, running, enqueued):
    enqueued.clear()

    response = operator_api.post(islands_of(running), {"name": "south-a", "region": "us-south",
                                                       "speed": 0.5})

    assert response.status_code == 201
    assert (response.json()["name"], response.json()["region"]) == ("south-a", "us-south")
    assert Island.objects.get(run=running, name="south-a").speed == 0.5
    assert [task["args"][1] for task in enqueued] == ["south-a"]


def test_a_bad_island_is_keyed_by_its_own_field(operator_api, running):
    response = operator_api.post(islands_of(running), {"name": "east-a", "region": "mars"})

    assert response.status_code == 422
    errors = response.json()["errors"]
    assert set(errors) == {"name", "region"}
    assert "mars" in errors["region"][0]


def test_an_island_with_an_unknown_field_is_refused(operator_api, running):
    response = operator_api.post(islands_of(running), {"name": "x", "region": "us-east",
                                                       "gpus": 8})

    assert response.status_code == 422
    [message] = response.json()["errors"]["gpus"]
    assert message.startswith("Unknown field; expected name, region, ")


@pytest.mark.parametrize("field, value, message", [
    ("speed", "fast", "Must be a number, got 'fast'."),
    ("speed", None, "This field is required."),
    ("batch_size", 5000, "Must be between 1 and 4096, got 5000."),
])
def test_an_islands_values_are_checked_by_the_config_keyed_by_field(operator_api, running,
                                                                    field, value, message):
    response = operator_api.post(islands_of(running), {"name": "x", "region": "us-east",
                                                       field: value})

    assert response.status_code == 422
    assert response.json() == {"errors": {field: [message]}}


def test_an_operator_can_remove_an_island(operator_api, running):
    response = operator_api.delete(f"{islands_of(running)}/east-b")

    assert response.status_code == 204
    running.refresh_from_db()
    assert [i["name"] for i in running.config["islands"]] == ["east-a", "west-a"]
    names = [i["name"] for i in operator_api.get(islands_of(running)).json()["islands"]]
    assert names == ["east-a", "west-a"]


def test_removing_an_island_below_the_quorum_is_refused(operator_api, running):
    operator_api.delete(f"{islands_of(running)}/east-b")

    response = operator_api.delete(f"{islands_of(running)}/west-a")

    assert response.status_code == 422
    assert "sync.min_quorum" in response.json()["errors"]


def test_a_missing_island_is_a_404_that_names_the_islands(operator_api, running):
    response = operator_api.post(f"{islands_of(running)}/nowhere/rejoin")

    assert response.status_code == 404
    assert response.json() == {"errors": {"island": [
        f"Run {running.pk} has no island named 'nowhere' (it has east-a, east-b, west-a)."]}}


def test_an_operator_can_rejoin_an_island_in_its_next_epoch(operator_api, running, enqueued):
    enqueued.clear()

    response = operator_api.post(f"{islands_of(running)}/east-a/rejoin")

    assert response.status_code == 202
    assert response.json()["epoch"] == 2
    assert enqueued[0]["args"][1:3] == ["east-a", 2]


def test_a_kill_is_sent_to_the_islands_supervisor(operator_api, operator, running, redis_url):
    response = operator_api.post(faults_of(running), {"kind": "kill"})

    assert response.status_code == 202
    assert response.json() == {"kind": "kill", "islands": ["east-a"]}
    command = RunStore(connect(redis_url), running.pk).signals.next_command("east-a")
    assert command["kind"] == "kill"
    assert Event.objects.filter(run=running, kind="fault", actor=operator,
                                detail__fault="kill").exists()


@pytest.mark.parametrize("kind", ["straggle", "partition", "degrade", "corrupt"])
def test_an_island_fault_is_set_for_the_island_to_act_out(operator_api, running, redis_url,
                                                          kind):
    response = operator_api.post(faults_of(running), {"kind": kind, "duration_s": 20})

    assert response.status_code == 202
    store = RunStore(connect(redis_url), running.pk)
    assert json.loads(store.client.get(store.key("fault", "east-a")))["kind"] == kind


@pytest.mark.parametrize("body, key, message", [
    ({"kind": "meteor", "duration_s": 1}, "kind",
     "Must be 'kill', 'straggle', 'partition', 'degrade' or 'corrupt', got 'meteor'."),
    ({"duration_s": 1}, "kind", "This field is required."),
    ({"kind": "straggle"}, "duration_s",
     f"A straggle fault needs duration_s, in seconds (more than 0, at most "
     f"{MAX_FAULT_SECONDS})."),
    ({"kind": "straggle", "duration_s": 0}, "duration_s",
     f"Must be more than 0 and at most {MAX_FAULT_SECONDS} seconds, got 0."),
    ({"kind": "straggle", "duration_s": -5}, "duration_s",
     f"Must be more than 0 and at most {MAX_FAULT_SECONDS} seconds, got -5."),
    ({"kind": "straggle", "duration_s": MAX_FAULT_SECONDS + 1}, "duration_s",
     f"Must be more than 0 and at most {MAX_FAULT_SECONDS} seconds, got 86401."),
    ({"kind": "straggle", "duration_s": "soon"}, "duration_s",
     "Input should be a valid number, got 'soon'."),
    ({"kind": "straggle", "duration_s": True}, "duration_s",
     "Input should be a valid number, got True."),
    ({"kind": "kill", "duration_s": 5}, "duration_s", "A kill is instant: leave duration_s out."),
    ({"kind": "kill", "factor": 2}, "factor", "A kill takes no factor."),
    ({"kind": "straggle", "duration_s": 5, "factor": 0.5}, "factor",
     "The factor of straggle must be between 1 and 1e6 (each inner step takes factor times "
     "as long), got 0.5."),
    ({"kind": "degrade", "duration_s": 5, "factor": "fast"}, "factor",
     "Input should be a valid number, got 'fast'."),
    ({"kind": "kill", "island": "east-b"}, "island",
     "Unknown field; expected kind, duration_s, factor."),
])
def test_it_explains_what_is_wrong_with_a_fault(operator_api, running, body, key, message):
    response = operator_api.post(faults_of(running), body)

    assert response.status_code == 422
    assert response.json() == {"errors": {key: [message]}}


def test_a_corrupt_fault_needs_no_duration(operator_api, running, redis_url):
    response = operator_api.post(faults_of(running), {"kind": "corrupt"})

    assert response.status_code == 202
    store = RunStore(connect(redis_url), running.pk)
    assert json.loads(store.client.get(store.key("fault", "east-a")))["kind"] == "corrupt"


def test_a_fault_on_a_paused_run_is_a_409(operator_api, paused):
    response = operator_api.post(faults_of(paused), {"kind": "partition", "duration_s": 5})

    assert response.status_code == 409
    assert response.json()["errors"]["state"][0].startswith("cannot inject a fault")


def test_a_kill_on_a_draft_is_a_409(operator_api, draft):
    response = operator_api.post(faults_of(draft), {"kind": "kill"})

    assert response.status_code == 409


def test_a_region_outage_kills_every_island_there(operator_api, running, redis_url):
    response = operator_api.post(f"/api/runs/{running.pk}/regions/us-east/faults",
                                 {"kind": "outage"})

    assert response.status_code == 202
    assert response.json() == {"kind": "outage", "islands": ["east-a", "east-b"]}
    store = RunStore(connect(redis_url), running.pk)
    assert store.signals.next_command("east-b")["kind"] == "kill"
    assert store.signals.next_command("west-a") is None


def test_a_region_without_islands_is_a_404(operator_api, running):
    response = operator_api.post(f"/api/runs/{running.pk}/regions/us-south/faults",
                                 {"kind": "outage"})

    assert response.status_code == 404
    assert response.json() == {"errors": {"region": [
        f"Run {running.pk} has no island in region 'us-south' (its regions: us-east, "
        "us-west)."]}}


def test_a_region_fault_is_an_outage(operator_api, running):
    response = operator_api.post(f"/api/runs/{running.pk}/regions/us-east/faults",
                                 {"kind": "kill"})

    assert response.status_code == 422
    assert response.json() == {"errors": {"kind": ["Must be 'outage', got 'kill'."]}}


def test_an_admin_can_kill_syncd(admin_api, admin, running, redis_url):
    response = admin_api.post("/api/system/faults", {"kind": "kill_syncd"})

    assert response.status_code == 202
    assert connect(redis_url).lpop("arch:syncd:control") == b"kill"
    assert Event.objects.filter(run=running, actor=admin, detail__fault="kill_syncd").exists()


def test_an_operator_may_not_kill_syncd(operator_api, redis_url):
    response = operator_api.post("/api/system/faults", {"kind": "kill_syncd"})

    assert response.status_code == 403
    assert response.json() == {"errors": {"permission": ["Only admins may do this."]}}
    assert connect(redis_url).lpop("arch:syncd:control") is None


def test_the_island_log_gives_its_last_lines(viewer_api, running, tmp_path, settings):
    settings.LOG_DIR = tmp_path
    path = island_log_path(settings.LOG_DIR, running.pk, "east-a")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"line {n}\n" for n in range(100)))

    response = viewer_api.get(f"{islands_of(running)}/east-a/log", lines=3)

    assert response.status_code == 200
    assert response.json() == {"lines": ["line 97", "line 98", "line 99"]}


def test_the_island_log_refuses_too_many_lines(viewer_api, running):
    response = viewer_api.get(f"{islands_of(running)}/east-a/log", lines=10**6)

    assert response.status_code == 422
    assert response.json() == {"errors": {"lines": ["Must be at most 1000, got 1000000."]}}
