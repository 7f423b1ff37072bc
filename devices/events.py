"""Group names and events of the devices app. Events leave only after commit.

Groups:
  device_group(device_id)  the live tunnel connection of one device (doorbell, close, calls)
  user_group(user_id)      the owner's open pages (presence)

Channel-layer message types handled by the tunnel consumer (devices.consumers.DeviceConsumer):
  devices.outbox     doorbell: "read the outbox" (one per commit, never one per item)
  devices.close      {code}: close the tunnel with this code (revocation: 4403)
  devices.replaced   close with 4409 (sent to the older connection's channel)
  device.call        {call_id, reply_channel, method, params} -> reply {type: device.call.reply, call_id, response}
  device.forward / device.stream_open / device.stream_close   see devices.consumers
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from ai1net.realtime import group_send_on_commit

PRESENCE_CHANGED = "devices.presence.changed"
OUTBOX_DOORBELL = "devices.outbox"
CLOSE = "devices.close"
REPLACED = "devices.replaced"


def device_group(device_id: UUID | str) -> str:
    return f"dev.{UUID(str(device_id)).hex}"


def user_group(user_id: int | str) -> str:
    return f"devices.user.{user_id}"


def presence_payload(device: Any) -> dict[str, Any]:
    return {
        "device_id": str(device.id),
        "online": device.is_online,
        "last_seen_at": device.last_seen_at.isoformat() if device.last_seen_at else None,
        "connection_count": device.connection_count,
    }


def _send_on_commit(group: str, message: dict[str, Any]) -> None:
    group_send_on_commit(group, message)


def send_presence_changed(device: Any) -> None:
    _send_on_commit(user_group(device.owner_id), {"type": PRESENCE_CHANGED, **presence_payload(device)})


def send_outbox_doorbell(device_id: UUID | str) -> None:
    _send_on_commit(device_group(device_id), {"type": OUTBOX_DOORBELL})


def send_close(device_id: UUID | str, code: int) -> None:
    _send_on_commit(device_group(device_id), {"type": CLOSE, "code": code})
