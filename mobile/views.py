from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.contrib.auth.views import redirect_to_login
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.csrf import ensure_csrf_cookie

from ai1net.accounts.selectors import mobile_reply_active
from im.access import http_otp_satisfied


@login_required
@ensure_csrf_cookie
def phone(request: HttpRequest) -> HttpResponse:
    """The phone page. With mobile reply off it does not exist."""
    if not mobile_reply_active(request.user):
        raise Http404()
    if not http_otp_satisfied(request):
        return redirect_to_login(request.get_full_path())
    return render(request, "mobile.html")
