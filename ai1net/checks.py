"""The platform's own system checks (registered by the accounts app's ``ready``)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks


@checks.register(checks.Tags.security, deploy=True)
def device_web_host_check(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """ai1net.W001: device web on the platform's own host in production."""
    if settings.DEBUG or not settings.DEVICE_WEB_ENABLED or settings.DEVICE_WEB_HOST:
        return []
    return [checks.Warning(
        "Device web is served from the platform's own origin: a page served by a service on a user's "
        "device can run script with that user's platform session.",
        hint="Set AI1NET_DEVICE_WEB_HOST to a host of its own (e.g. dw.ai1net.example, pointing at the same "
             "daphne), or switch device web off with AI1NET_DEVICE_WEB=0.",
        id="ai1net.W001",
    )]
