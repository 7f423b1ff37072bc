"""``/ws/mobile``: the user's own mobile events (and their devices' presence), nothing else."""

from __future__ import annotations

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from ai1net.accounts.selectors import mobile_reply_active
from ai1net.consumers import LoopDispatch
from devices.events import user_group as devices_user_group
from im.access import otp_satisfied
from mobile import events, selectors

CLOSE_NOT_ALLOWED = 4404


class MobileConsumer(LoopDispatch, AsyncJsonWebsocketConsumer):
    joined: tuple[str, ...] = ()

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated or not await self._allowed(user):
            await self.close(code=CLOSE_NOT_ALLOWED)
            return
        self.joined = (events.user_group(user.pk), devices_user_group(user.pk))
        for group in self.joined:
            await self.channel_layer.group_add(group, self.channel_name)
        await self.accept()
        await self.send_json(await self._snapshot(user))

    @database_sync_to_async
    def _allowed(self, user) -> bool:
        user.refresh_from_db()  # the switch may have changed since the session was loaded
        return mobile_reply_active(user) and otp_satisfied(user, self.scope.get("session"))

    @database_sync_to_async
    def _snapshot(self, user) -> dict:
        # The socket may have missed events while it was down: start from the database.
        return {"type": "mobile.snapshot", "questions": selectors.pending_questions(user=user),
                "state": selectors.mobile_state(user=user)}

    async def disconnect(self, code: int) -> None:
        for group in self.joined:
            await self.channel_layer.group_discard(group, self.channel_name)

    async def receive_json(self, content, **kwargs) -> None:
        # Read-only: answers go through POST /api/mobile/answer (CSRF, one code path).
        if isinstance(content, dict) and content.get("type") == "ping":
            await self.send_json({"type": "pong"})

    async def app_event(self, message: dict) -> None:
        await self._forward(message["event"])

    async def app_events(self, message: dict) -> None:
        """Several events of one commit in one layer message (ai1net.realtime), sent in order."""
        for event in message["events"]:
            if not await self._forward(event):
                return

    async def _forward(self, event: dict) -> bool:
        """Send one event; False once the socket is closed (mobile reply was turned off)."""
        await self.send_json(event)
        if event.get("type") == events.SWITCH_CHANGED and not event.get("enabled"):
            await self.close(code=CLOSE_NOT_ALLOWED)
            return False
        return True

    async def devices_presence_changed(self, message: dict) -> None:
        await self.send_json({"type": "devices.presence.changed", **_presence(message)})


def _presence(message: dict) -> dict:
    payload = message.get("event") or message.get("payload") or {
        k: v for k, v in message.items() if k != "type"}
    return {k: payload.get(k) for k in ("device_id", "online", "last_seen_at", "connection_count")}
