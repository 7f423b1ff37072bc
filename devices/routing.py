from django.urls import path

from clients import protocol
from devices import consumers

device_websocket_urlpatterns = [path(protocol.TUNNEL_PATH.lstrip("/"), consumers.DeviceConsumer.as_asgi())]
websocket_urlpatterns = [path("ws/devices", consumers.DevicesPageConsumer.as_asgi())]
