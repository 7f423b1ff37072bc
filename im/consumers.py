"""The live room socket: members only; events come from im.events after commit."""

from __future__ import annotations

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from ai1net.consumers import AppEvents, LoopDispatch
from ai1net.exceptions import NotFound
from im import events, selectors
from im.access import otp_satisfied

CLOSE_NOT_ALLOWED = 4404


class RoomConsumer(AppEvents, LoopDispatch, AsyncJsonWebsocketConsumer):
    group: str | None = None

    async def connect(self) -> None:
        user = self.scope.get("user")
        room_id = self.scope["url_route"]["kwargs"]["room_id"]
        if user is None or not user.is_authenticated or not await self._allowed(user, room_id):
            await self.close(code=CLOSE_NOT_ALLOWED)
            return
        self.group = events.room_group(room_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()

    @database_sync_to_async
    def _allowed(self, user, room_id: str) -> bool:
        try:
            selectors.access_room(user=user, room_id=room_id)
        except NotFound:
            return False
        return otp_satisfied(user, self.scope.get("session"))

    async def disconnect(self, code: int) -> None:
        if self.group:
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive_json(self, content, **kwargs) -> None:
        # Read-only socket: writes go through the REST API (CSRF, one code path).
        if isinstance(content, dict) and content.get("type") == "ping":
            await self.send_json({"type": "pong"})

