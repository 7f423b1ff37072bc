from django.urls import path

from devices import api, longpoll, views

app_name = "devices"

urlpatterns = [
    path("api/devices/pairings", api.PairingCreateView.as_view(), name="api-pairing-create"),
    path("api/devices/pairings/token", api.PairingTokenView.as_view(), name="api-pairing-token"),
    path("api/devices/pairings/code/<str:user_code>", api.PairingCodeView.as_view(), name="api-pairing-code"),
    path("api/devices/pairings/code/<str:user_code>/approve", api.PairingApproveView.as_view(),
         name="api-pairing-approve"),
    path("api/devices/pairings/code/<str:user_code>/deny", api.PairingDenyView.as_view(), name="api-pairing-deny"),
    path("api/devices", api.DeviceListView.as_view(), name="api-device-list"),
    path("api/devices/<uuid:device_id>", api.DeviceDetailView.as_view(), name="api-device-detail"),
    path("api/devices/<uuid:device_id>/revoke", api.DeviceRevokeView.as_view(), name="api-device-revoke"),
    path("api/devices/bridge/pull", longpoll.pull, name="api-bridge-pull"),
    path("api/devices/bridge/push", longpoll.push, name="api-bridge-push"),
    path("pair/", views.pair_enter, name="pair"),
    path("pair/<str:user_code>", views.pair_code, name="pair-code"),
    path("devices/", views.device_list, name="list"),
]
