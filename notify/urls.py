from django.urls import path

from notify import api, views

app_name = "notify"

urlpatterns = [
    path("m/sw.js", views.service_worker, name="service-worker"),
    path("api/notify/subscriptions", api.SubscriptionsView.as_view(), name="subscriptions"),
    path("api/notify/subscriptions/<int:subscription_id>", api.SubscriptionDetailView.as_view(),
         name="subscription"),
    path("api/notify/ntfy", api.NtfyView.as_view(), name="ntfy"),
    path("api/notify/vapid-public-key", api.VapidKeyView.as_view(), name="vapid-public-key"),
]
