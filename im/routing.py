from django.urls import re_path

from im import consumers

websocket_urlpatterns = [
    re_path(r"^ws/rooms/(?P<room_id>[0-9a-fA-F-]{32,36})$", consumers.RoomConsumer.as_asgi()),
]
