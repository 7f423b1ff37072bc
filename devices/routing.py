from django.urls import path, re_path

from clients import protocol
from devices import consumers
from devices.web.http import http_application
from devices.web.ws import DeviceWebSocketConsumer

# Device web: /d/<device>/<port>/<path> (HTTP streamed by a raw ASGI app; WebSockets relayed).
DEVICE_WEB_PATH = r"^d/(?P<device_id>[^/]+)/(?P<port>[^/]+)(?P<rest>/.*)?$"

device_websocket_urlpatterns = [path(protocol.TUNNEL_PATH.lstrip("/"), consumers.DeviceConsumer.as_asgi())]
websocket_urlpatterns = [
    path("ws/devices", consumers.DevicesPageConsumer.as_asgi()),
    re_path(DEVICE_WEB_PATH, DeviceWebSocketConsumer.as_asgi()),
]
http_urlpatterns = [re_path(DEVICE_WEB_PATH, http_application())]
