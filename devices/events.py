"""Group names and events of the devices app. Events leave only after commit.

Groups:
  user_group(user_id)      the owner's open pages (presence): ``app.event`` / ``app.events`` (ai1net.realtime)
                           carrying ``devices.presence.changed`` events, as the pages' sockets send them on
A device's live tunnel connection has no group: messages for it go to its channel, the row's
``channel_name`` (read with the write that calls for them: the outbox's seq allocation locks the row,
so no hello can make another connection live between that read and the commit).

Channel-layer message types handled by the tunnel consumer (devices.consumers.DeviceConsumer):
  devices.outbox     doorbell: "read the outbox" (one per commit, never one per item); with
                     {frames: [[seq, deliver frame], ...]} the committed items themselves (send these).
                     Scaled out it goes straight to the holding process's stream relay when the row names
                     one (devices.web.relay), through the layer when that fails
  devices.close      {code}: close the tunnel with this code (revocation: 4403)
  devices.replaced   close with 4409 (sent to the older connection's channel)
  device.call        {call_id, reply_channel, method, params} -> reply {type: device.call.reply, call_id, response}
  device.forward / device.stream_open / device.stream_close   see devices.consumers
"""

from __future__ import annotations

from typing import Any

from ai1net.realtime import APP_EVENT, channel_send_on_commit, group_send_on_commit
from devices.models import is_tunnel_channel

PRESENCE_CHANGED = "devices.presence.changed"
OUTBOX_DOORBELL = "devices.outbox"
CLOSE = "devices.close"
REPLACED = "devices.replaced"


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
    # As an app event: while one send to the owner's pages is on its way, the changes after it wait and
    # leave together (ai1net.realtime), one layer message for many devices in a fleet's reconnect storm.
    _send_on_commit(user_group(device.owner_id),
                    {"type": APP_EVENT, "event": {"type": PRESENCE_CHANGED, **presence_payload(device)}})


def send_outbox_doorbell(channel_name: str, frames: list[tuple[int, str]] | None = None, *, relay: str = "") -> None:
    """``frames``: the committed items it rings for, as (seq, deliver frame), when the ringer has them.
    ``relay``: the stream relay of the process that holds the connection (``Device.relay``), which takes the
    doorbell straight there (devices.web.relay.send_to_tunnel); the channel layer when it cannot."""
    if is_tunnel_channel(channel_name):  # a poll reads on its own
        message: dict[str, Any] = {"type": OUTBOX_DOORBELL}
        if frames:
            message["frames"] = frames
        channel_send_on_commit(channel_name, message, direct=relay)


def send_close(channel_name: str, code: int) -> None:
    if is_tunnel_channel(channel_name):
        channel_send_on_commit(channel_name, {"type": CLOSE, "code": code})
