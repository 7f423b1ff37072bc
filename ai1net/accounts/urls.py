from django.contrib.auth import views as auth_views
from django.urls import path

from ai1net.accounts import views

app_name = "accounts"

urlpatterns = [
    path("accounts/login/", views.login_view, name="login"),
    path("accounts/login/code/", views.login_otp_view, name="login_otp"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("accounts/", views.account, name="account"),
    path("accounts/mobile-reply/", views.mobile_reply_set, name="mobile_reply"),
    path("accounts/two-factor/start/", views.otp_start, name="otp_start"),
    path("accounts/two-factor/confirm/", views.otp_confirm, name="otp_confirm"),
    path("accounts/two-factor/remove/", views.otp_remove, name="otp_remove"),
    path("accounts/two-factor/backup-codes/", views.backup_codes_regenerate, name="backup_codes"),
    path("accounts/tokens/", views.api_token_create, name="token_create"),
    path("accounts/tokens/<int:token_id>/revoke/", views.api_token_revoke, name="token_revoke"),
    path("setup/<str:token>", views.first_run, name="first_run"),
]
