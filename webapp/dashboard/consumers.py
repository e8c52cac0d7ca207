"""The run page's live websocket: /ws/runs/<id>/.

On connect a signed-in user gets the snapshot syncd keeps in Redis, with its
sequence number, and the run's latest events. After that:
- {"type": "delta", "seq", "base", "ops"}: what changed in syncd's status since
  snapshot `base` (syncd/live.py); the page applies it only on top of `base` and
  takes a fresh snapshot (reconnects) when it sees a gap;
- {"type": "status", "seq", "status"}: a whole status, after syncd restarted;
- {"type": "events", "events"}: new events, numbered by id.
The group is joined before the snapshot is read, so no delta falls between them;
the page drops deltas whose seq is not newer than its snapshot.
"""

from __future__ import annotations

import json
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from syncd.finite import finite
from syncd.live import status_group
from webapp.runs.live import RUNS_GROUP
from webapp.runs.models import Event, Island, Run, Simulation
from webapp.runs.roles import can
from webapp.runs.simulations import simulation_group
from webapp.runs.stores import run_store

UNAUTHORIZED = 4401
NOT_FOUND = 4404
RECENT_EVENTS = 50


class FiniteJsonConsumer(AsyncJsonWebsocketConsumer):
    """A JSON websocket consumer whose messages a browser can always parse: a NaN or
    an infinity goes out as null (syncd/finite.py)."""

    @classmethod
    async def encode_json(cls, content: Any) -> str:
        return json.dumps(finite(content), allow_nan=False)


class RunStatusConsumer(FiniteJsonConsumer):
    async def connect(self) -> None:
        if not can(self.scope.get("user"), "view"):
            await self.close(code=UNAUTHORIZED)
            return
        self.run_id = int(self.scope["url_route"]["kwargs"]["run_id"])
        if not await self._exists():
            await self.close(code=NOT_FOUND)
            return
        self.group = status_group(self.run_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        snapshot, events = await self._snapshot()
        await self.send_json({"type": "snapshot", "seq": snapshot.get("seq", 0),
                              "status": snapshot, "events": events})

    async def disconnect(self, code: int) -> None:
        if hasattr(self, "group"):
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def run_status(self, message: dict[str, Any]) -> None:
        await self.send_json({"type": "status", "seq": message["seq"],
                              "status": message["status"]})

    async def run_delta(self, message: dict[str, Any]) -> None:
        await self.send_json({"type": "delta", "seq": message["seq"], "base": message["base"],
                              "ops": message["ops"]})

    async def run_events(self, message: dict[str, Any]) -> None:
        await self.send_json({"type": "events", "events": message["events"]})

    @database_sync_to_async
    def _exists(self) -> bool:
        return Run.objects.filter(pk=self.run_id).exists()

    @database_sync_to_async
    def _snapshot(self) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        names = dict(Island.objects.filter(run_id=self.run_id).values_list("id", "name"))
        recent = Event.objects.filter(run_id=self.run_id).select_related("actor")
        events = [e.to_dict(names) for e in recent.order_by("-id")[:RECENT_EVENTS]]
        return run_store(self.run_id).status() or {}, events[::-1]


class RunsListConsumer(FiniteJsonConsumer):
    """/ws/runs/: every run's state changes, for the runs list."""

    async def connect(self) -> None:
        if not can(self.scope.get("user"), "view"):
            await self.close(code=UNAUTHORIZED)
            return
        await self.channel_layer.group_add(RUNS_GROUP, self.channel_name)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        await self.channel_layer.group_discard(RUNS_GROUP, self.channel_name)

    async def runs_state(self, message: dict[str, Any]) -> None:
        await self.send_json({"type": "run_state", "run": message["run"],
                              "state": message["state"]})

    async def runs_progress(self, message: dict[str, Any]) -> None:
        await self.send_json({"type": "run_progress", "run": message["run"],
                              "tokens": message["tokens"], "progress": message["progress"]})


class SimulationConsumer(FiniteJsonConsumer):
    """/ws/simulations/<id>/: the simulation as it is, then every update of it."""

    async def connect(self) -> None:
        if not can(self.scope.get("user"), "view"):
            await self.close(code=UNAUTHORIZED)
            return
        self.simulation_id = int(self.scope["url_route"]["kwargs"]["simulation_id"])
        self.group = simulation_group(self.simulation_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        current = await self._current()
        if current is None:
            await self.close(code=NOT_FOUND)
            return
        await self.accept()
        await self.send_json({"type": "simulation", "simulation": current})

    async def disconnect(self, code: int) -> None:
        if hasattr(self, "group"):
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def simulation_update(self, message: dict[str, Any]) -> None:
        await self.send_json({"type": "simulation", "simulation": message["simulation"]})

    @database_sync_to_async
    def _current(self) -> dict[str, Any] | None:
        found = Simulation.objects.filter(pk=self.simulation_id).first()
        return found.to_dict() if found else None
