"""The admin site: staff get in only with a session verified by two-factor (django-otp)."""

from __future__ import annotations

from urllib.parse import urlencode

from django.contrib import admin, messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.urls import reverse

from ai1net.accounts import selectors


def _is_verified(request: HttpRequest) -> bool:
    check = getattr(request.user, "is_verified", None)
    return bool(check and check())


class OTPAdminSite(admin.AdminSite):
    site_header = "ai1net operators"
    site_title = "ai1net admin"

    def has_permission(self, request: HttpRequest) -> bool:
        return super().has_permission(request) and _is_verified(request)

    def login(self, request: HttpRequest, extra_context: dict | None = None) -> HttpResponse:
        # One way in for everybody: the platform's own login with its two-factor step.
        next_url = request.GET.get("next") or reverse("admin:index")
        query = urlencode({"next": next_url})
        user = request.user
        if user.is_authenticated:
            if not (user.is_active and user.is_staff):
                messages.error(request, "Your account cannot use the admin.")
                return redirect("home")
            if selectors.user_needs_otp(user):
                messages.warning(request, "The admin needs your two-factor code.")
                return redirect(f"{reverse('accounts:login_otp')}?{query}")
            messages.warning(request, "The admin needs two-factor: set up an authenticator app first.")
            return redirect("accounts:account")
        return redirect(f"{reverse('accounts:login')}?{query}")

    def each_context(self, request: HttpRequest) -> dict:
        context = super().each_context(request)
        context["global_stops"] = selectors.global_stops()
        return context
