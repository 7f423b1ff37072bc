from django.contrib.auth import views as auth_views
from django.urls import path

from ai1net.accounts import views

app_name = "accounts"

urlpatterns = [
    path("accounts/login/", auth_views.LoginView.as_view(template_name="accounts/login.html"), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("accounts/", views.account, name="account"),
]
