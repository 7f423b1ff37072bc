"""Keep the bridges told: the user's switch changed, or a bridge (re)connected."""

from __future__ import annotations

from typing import Any

from django.dispatch import receiver

from ai1net.accounts.signals import switch_changed
from devices.models import Device
from devices.signals import device_connected
from mobile import services


@receiver(switch_changed, dispatch_uid="mobile.switch_changed")
def on_switch_changed(sender: Any, user: Any, switch: str, enabled: bool, **kwargs: Any) -> None:
    if switch == "mobile_reply":
        services.switch_broadcast(user=user)


@receiver(device_connected, dispatch_uid="mobile.device_connected")
def on_device_connected(sender: Any, device: Device, **kwargs: Any) -> None:
    if device.kind == Device.Kind.BRIDGE:
        services.bridge_connected(device=device)
