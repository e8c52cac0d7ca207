"""The live websockets with a real channel layer on the tests' own Redis."""

import json

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import AnonymousUser

from syncd.connection import connect
from syncd.store import RunStore
from webapp.asgi import application
from webapp.dashboard.consumers import (
    NOT_FOUND,
    UNAUTHORIZED,
    RunsListConsumer,
    RunStatusConsumer,
)
from webapp.runs.live import channel_notifier
from webapp.runs.models import Event, Run
from webapp.runs.services import create_run

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def communicator(path: str, user=None) -> WebsocketCommunicator:
    run_id = int(path.rstrip("/").split("/")[-1])
    com = WebsocketCommunicator(RunStatusConsumer.as_asgi(), path)
    com.scope["user"] = user
    com.scope["url_route"] = {"kwargs": {"run_id": run_id}}
    return com


@pytest.fixture
def run(redis_url):
    run = create_run(name="live", mode="decoupled", config={}, user=None)
    RunStore(connect(redis_url), run.pk).put_status({"versions": [3, 4]})
    return run


def test_a_signed_in_user_gets_the_snapshot_with_recent_events_then_deltas(
        run, viewer, channel_layer):
    Event.objects.create(run=run, kind=Event.Kind.ALERT, detail={"message": "before"})
    com = communicator(f"/ws/runs/{run.pk}/", viewer)
    notify = channel_notifier()

    async def session() -> tuple[bool, dict, dict, dict]:
        # One event loop for the whole conversation: the consumer lives in it.
        connected, _ = await com.connect()
        snapshot = await com.receive_json_from()
        await sync_to_async(notify)(str(run.pk), 1, {"versions": [3, 4], "goodput": None})
        whole = await com.receive_json_from(timeout=5)
        await sync_to_async(notify)(str(run.pk), 2, {"versions": [4, 4], "goodput": None})
        delta = await com.receive_json_from(timeout=5)
        await com.disconnect()
        return connected, snapshot, whole, delta

    connected, snapshot, whole, delta = async_to_sync(session)()
    assert connected
    assert snapshot["type"] == "snapshot" and snapshot["seq"] == 1
    assert snapshot["status"] == {"versions": [3, 4], "seq": 1}
    assert [e["detail"]["message"] for e in snapshot["events"]] == ["before"]
    assert whole == {"type": "status", "seq": 1,
                     "status": {"versions": [3, 4], "goodput": None}}
    assert delta == {"type": "delta", "seq": 2, "base": 1, "ops": [[["versions"], [4, 4]]]}


def test_new_events_reach_the_page_numbered_by_id(run, viewer, channel_layer):
    com = communicator(f"/ws/runs/{run.pk}/", viewer)

    async def session() -> dict:
        await com.connect()
        await com.receive_json_from()
        await sync_to_async(run.transition)(Run.State.QUEUED)
        pushed = await com.receive_json_from(timeout=5)
        await com.disconnect()
        return pushed

    pushed = async_to_sync(session)()
    [event] = pushed["events"]
    assert pushed["type"] == "events"
    assert event["id"] == Event.objects.get(kind=Event.Kind.RUN_STATE).pk
    assert (event["kind"], event["detail"]["to"]) == ("run_state", "queued")


def test_the_runs_list_hears_every_runs_state_changes(run, viewer, channel_layer):
    com = WebsocketCommunicator(RunsListConsumer.as_asgi(), "/ws/runs/")
    com.scope["user"] = viewer

    async def session() -> tuple[bool, dict]:
        connected, _ = await com.connect()
        await sync_to_async(run.transition)(Run.State.QUEUED)
        pushed = await com.receive_json_from(timeout=5)
        await com.disconnect()
        return connected, pushed

    connected, pushed = async_to_sync(session)()
    assert connected
    assert pushed == {"type": "run_state", "run": run.pk, "state": "queued"}


def test_an_anonymous_connection_is_refused(run, channel_layer):
    connected, code = async_to_sync(communicator(f"/ws/runs/{run.pk}/", AnonymousUser()).connect)()
    assert not connected and code == UNAUTHORIZED


def test_an_anonymous_runs_list_connection_is_refused(channel_layer):
    com = WebsocketCommunicator(RunsListConsumer.as_asgi(), "/ws/runs/")
    com.scope["user"] = AnonymousUser()
    connected, code = async_to_sync(com.connect)()
    assert not connected and code == UNAUTHORIZED


def test_a_run_that_does_not_exist_is_refused(viewer, channel_layer, redis_url):
    connected, code = async_to_sync(communicator("/ws/runs/999999/", viewer).connect)()
    assert not connected and code == NOT_FOUND


def test_the_asgi_application_routes_the_run_websocket_through_auth(run, channel_layer):
    com = WebsocketCommunicator(application, f"/ws/runs/{run.pk}/",
                                headers=[(b"origin", b"http://localhost"),
                                         (b"host", b"localhost")])
    connected, code = async_to_sync(com.connect)()
    assert not connected and code == UNAUTHORIZED  # no session cookie: anonymous


def test_a_nan_in_the_status_reaches_the_page_as_null(run, viewer, channel_layer):
    """Browsers refuse NaN in JSON: one diverged loss would stop the page's updates."""
    com = communicator(f"/ws/runs/{run.pk}/", viewer)
    notify = channel_notifier()

    async def session() -> str:
        await com.connect()
        await com.receive_json_from()
        await sync_to_async(notify)(str(run.pk), 1, {"versions": [3, 4],
                                                     "train_loss": float("nan")})
        text = await com.receive_from(timeout=5)
        await com.disconnect()
        return text

    text = async_to_sync(session)()
    assert "NaN" not in text
    assert json.loads(text)["status"]["train_loss"] is None
