from __future__ import annotations

from typing import Any

from django.apps import AppConfig


class ProbesConfig(AppConfig):
    name = "probes"

    def ready(self) -> None:
        from devices.signals import device_disconnected

        device_disconnected.connect(_fail_in_flight, dispatch_uid="probes.fail_in_flight")


def _fail_in_flight(sender: Any, device: Any, **kwargs: Any) -> None:
    from probes.services import commands_fail_in_flight

    if getattr(device, "kind", None) == "probe":
        commands_fail_in_flight(device=device)
