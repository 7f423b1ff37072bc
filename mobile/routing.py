from django.urls import re_path

from mobile import consumers

websocket_urlpatterns = [
    re_path(r"^ws/mobile$", consumers.MobileConsumer.as_asgi()),
]
