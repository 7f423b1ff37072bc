"""ASGI entry point (served by daphne).

HTTP goes through Django, except routes an app claims for streaming ASGI consumers (device web).
Browser WebSockets are origin-checked and session-authenticated; the device tunnel is not
origin-checked (devices are not browsers) and authenticates by its bearer token instead.
Each app contributes from its own ``routing.py``:
``websocket_urlpatterns`` (browser), ``device_websocket_urlpatterns``, ``http_urlpatterns``.
"""

from __future__ import annotations

import importlib
import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ai1net.settings")

from django.core.asgi import get_asgi_application  # noqa: E402

django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.urls import re_path  # noqa: E402

ROUTED_APPS = ("ai1net.accounts", "devices", "im", "mobile", "probes")


def _collect(attribute: str) -> list:
    patterns: list = []
    for app in ROUTED_APPS:
        try:
            module = importlib.import_module(f"{app}.routing")
        except ModuleNotFoundError as exc:
            if exc.name != f"{app}.routing":
                raise
            continue
        patterns.extend(getattr(module, attribute, []))
    return patterns


browser_websockets = AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(_collect("websocket_urlpatterns"))))

application = ProtocolTypeRouter(
    {
        "http": URLRouter([*_collect("http_urlpatterns"), re_path(r"", django_asgi_app)]),
        "websocket": URLRouter([*_collect("device_websocket_urlpatterns"), re_path(r"", browser_websockets)]),
    }
)
