from django.urls import path

from im import api

app_name = "im"

urlpatterns = [
    path("api/im/rooms", api.RoomListView.as_view(), name="rooms"),
    path("api/im/rooms/<str:room_id>", api.RoomDetailView.as_view(), name="room"),
    path("api/im/rooms/<str:room_id>/messages", api.MessagesView.as_view(), name="messages"),
    path("api/im/rooms/<str:room_id>/panels", api.PanelsView.as_view(), name="panels"),
    path("api/im/rooms/<str:room_id>/panels/<str:panel_id>/actions", api.PanelActionView.as_view(),
         name="panel-actions"),
]
