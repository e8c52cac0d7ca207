"""The live run websocket: /ws/runs/<id>/.

On connect a signed-in user gets the snapshot syncd keeps in Redis, with its
sequence number; after that, every snapshot syncd pushes to the run's group.
The page keeps the highest sequence number it has seen and drops anything
older, so a snapshot and a push that cross each other never go backwards.
"""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from syncd.server import status_group
from webapp.runs.models import Run
from webapp.runs.stores import run_store

UNAUTHORIZED = 4401
NOT_FOUND = 4404


class RunStatusConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=UNAUTHORIZED)
            return
        self.run_id = int(self.scope["url_route"]["kwargs"]["run_id"])
        snapshot = await self._snapshot()
        if snapshot is None:
            await self.close(code=NOT_FOUND)
            return
        self.group = status_group(self.run_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        await self.send_json({"type": "snapshot", "seq": snapshot.get("seq", 0),
                              "status": snapshot})

    async def disconnect(self, code: int) -> None:
        if hasattr(self, "group"):
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def run_status(self, event: dict[str, Any]) -> None:
        """A snapshot syncd pushed to the run's group."""
        await self.send_json({"type": "status", "seq": event["seq"], "status": event["status"]})

    @database_sync_to_async
    def _snapshot(self) -> dict[str, Any] | None:
        run = Run.objects.filter(pk=self.run_id).first()
        if run is None:
            return None
        return run_store(run).status() or {}
