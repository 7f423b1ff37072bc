from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render


@login_required
def account(request: HttpRequest) -> HttpResponse:
    return render(request, "accounts/account.html")


@login_required
def home(request: HttpRequest) -> HttpResponse:
    return render(request, "home.html")
