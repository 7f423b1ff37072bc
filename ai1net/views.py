from __future__ import annotations

import threading
import uuid
from pathlib import Path

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import connection
from django.http import FileResponse, Http404, HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET


@never_cache
@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    """Checks the database and the channel layer (a message sent to ourselves must come back)."""
    checks: dict[str, str] = {}
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        checks["database"] = "ok"
    except Exception as exc:  # noqa: BLE001 - a health check reports, it does not raise
        checks["database"] = f"error: {exc.__class__.__name__}"
    try:
        checks["channel_layer"] = async_to_sync(_ping_layer)()
    except Exception as exc:  # noqa: BLE001
        checks["channel_layer"] = f"error: {exc.__class__.__name__}"
    healthy = all(value == "ok" for value in checks.values())
    return JsonResponse({"status": "ok" if healthy else "error", **checks}, status=200 if healthy else 503)


async def _ping_layer() -> str:
    layer = get_channel_layer()
    channel = await layer.new_channel()
    marker = uuid.uuid4().hex
    await layer.send(channel, {"type": "healthz.ping", "marker": marker})
    message = await layer.receive(channel)
    return "ok" if message.get("marker") == marker else "error: wrong message"


DOWNLOADS = {"ai1net-bridge.pyz", "ai1net-probe.pyz"}
_build_lock = threading.Lock()


@never_cache
@require_GET
def download_client(request: HttpRequest, name: str) -> FileResponse:
    """The single-file clients. `make run` builds them; a missing one is built on first request."""
    if name not in DOWNLOADS:
        raise Http404("No such download.")
    path = Path(settings.DOWNLOADS_DIR) / name
    if not path.exists():
        with _build_lock:
            if not path.exists():
                from clients.build import build

                build(Path(settings.DOWNLOADS_DIR))
    if not path.exists():
        raise Http404("This client is not available.")
    return FileResponse(path.open("rb"), as_attachment=True, filename=name, content_type="application/zip")
