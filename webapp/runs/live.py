"""Events and status to the live pages, through the channel layer (Channels, Redis).

Every new Event row goes to its run's channel layer group, and syncd's status
snapshots go there as numbered deltas (channel_notifier, plugged into syncd).

Single events (from the web app's services) are pushed after their transaction
commits, by a post_save signal; syncd's batches call push_events itself after its
bulk insert, which sends no signals. Events are numbered by their ids, which only
grow, so a page drops what it has already seen.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterable
from typing import Any

from django.db import transaction

from syncd.live import LiveNotifier, status_group
from webapp.runs.models import Event, Island

log = logging.getLogger("archipelago.web")
RUNS_GROUP = "runs"  # the runs list: every run's state changes


SEND_TIMEOUT_S = 5.0


class GroupSender:
    """group_send from synchronous code on one event loop that lives as long as the
    process (a thread of its own), so the channel layer keeps its Redis connections:
    async_to_sync would start a loop, and a connection, per message.

    Calls block until the message is sent, so they keep their order.
    """

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    def __call__(self, group: str, message: dict[str, Any]) -> None:
        from channels.layers import get_channel_layer

        layer = get_channel_layer()
        if layer is None:
            return
        future = asyncio.run_coroutine_threadsafe(layer.group_send(group, message),
                                                  self._running_loop())
        future.result(timeout=SEND_TIMEOUT_S)

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                threading.Thread(target=self._loop.run_forever, name="channel-layer-sender",
                                 daemon=True).start()
            return self._loop


group_send = GroupSender()


def channel_notifier() -> LiveNotifier:
    """Push syncd's status snapshots to each run's channel layer group (Channels, Redis),
    as numbered deltas (syncd/live.py)."""
    return LiveNotifier(group_send, status_group)


def push_events(run_id: int, events: Iterable[Event]) -> None:
    """Send `events` (saved rows of run `run_id`) to the run's live pages."""
    events = [e for e in events if e.pk is not None]
    if not events:
        return
    names = dict(Island.objects.filter(run_id=run_id).values_list("id", "name"))
    message: dict[str, Any] = {"type": "run.events",
                               "events": [e.to_dict(names) for e in events]}
    send_to_group(status_group(run_id), message)
    for event in events:
        if event.kind == Event.Kind.RUN_STATE:
            send_to_group(RUNS_GROUP, {"type": "runs.state", "run": run_id,
                               "state": event.detail.get("to")})


def send_to_group(group: str, message: dict[str, Any]) -> None:
    """Send a message to a channel layer group; a failure is logged, never raised."""
    try:
        group_send(group, message)
    except Exception:  # the live page is a view of the database; never fail a write for it
        log.exception("could not push to %s", group)


def on_event_saved(sender: type[Event], instance: Event, created: bool, **kwargs: Any) -> None:
    if created and not kwargs.get("raw"):
        transaction.on_commit(lambda: push_events(instance.run_id, [instance]))
