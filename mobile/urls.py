from django.urls import path

from mobile import api, views

app_name = "mobile"

urlpatterns = [
    path("m/", views.phone, name="phone"),
    path("api/mobile/pending", api.PendingView.as_view(), name="pending"),
    path("api/mobile/answer", api.AnswerView.as_view(), name="answer"),
    path("api/mobile/state", api.StateView.as_view(), name="state"),
    path("api/mobile/sessions/<str:session_id>/messages", api.SessionMessageView.as_view(), name="session-messages"),
    path("api/mobile/sessions/<str:session_id>/keep_going", api.KeepGoingView.as_view(), name="keep-going"),
]
