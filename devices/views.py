"""Pages: enter a pairing code, approve or deny a device, my devices (live presence)."""

from __future__ import annotations

import qrcode
import qrcode.image.svg
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.safestring import mark_safe

from ai1net import hosts
from ai1net.accounts.selectors import device_web_active
from ai1net.exceptions import ApplicationError, retry_after_header
from clients import protocol
from devices import selectors, services
from devices.access import http_otp_satisfied
from devices.api import client_ip, public_base
from devices.models import Device


def _otp_refusal(request: HttpRequest) -> HttpResponse | None:
    if http_otp_satisfied(request):
        return None
    return render(request, "devices/pair_code.html",
                  {"error": "Verify your sign-in with your one-time code first."}, status=403)


def qr_svg(data: str) -> str:
    image = qrcode.make(data, image_factory=qrcode.image.svg.SvgPathImage, border=2)
    return image.to_string(encoding="unicode")


@login_required
def pair_enter(request: HttpRequest) -> HttpResponse:
    if refusal := _otp_refusal(request):
        return refusal
    error = ""
    if request.method == "POST":
        code = services.normalize_user_code(request.POST.get("user_code", ""))
        if code:
            return redirect("devices:pair-code", user_code=services.format_user_code(code))
        error = "That is not a pairing code: 8 letters, as shown in the terminal (XXXX-XXXX)."
    return render(request, "devices/pair_enter.html", {"error": error})


@login_required
def pair_code(request: HttpRequest, user_code: str) -> HttpResponse:
    if refusal := _otp_refusal(request):
        return refusal
    code = services.normalize_user_code(user_code)
    shown = services.format_user_code(code) if code else user_code
    try:
        pairing = services.pairing_scan(user=request.user, user_code=user_code, ip=client_ip(request))
    except ApplicationError as exc:
        response = render(request, "devices/pair_code.html", {"error": exc.detail, "user_code": shown},
                          status=exc.status)
        for name, value in retry_after_header(exc).items():
            response[name] = value
        return response
    link = public_base(request) + reverse("devices:pair-code", args=[shown])
    return render(
        request,
        "devices/pair_code.html",
        {"pairing": pairing, "user_code": shown, "qr": mark_safe(qr_svg(link)), "link": link},  # noqa: S308
    )


@login_required
def device_list(request: HttpRequest) -> HttpResponse:
    if refusal := _otp_refusal(request):
        return refusal
    devices = list(selectors.devices_for_user(user=request.user))
    # Device web: a bridge's exposed ports, as links (on device web's own host when it has one).
    origin = hosts.device_web_origin(request.scheme, request.get_host()) if hosts.separate() else ""
    for device in devices:
        ports = device.ports if device.kind == Device.Kind.BRIDGE and device.status == Device.Status.ACTIVE else []
        device.web_links = [(port, f"{origin}/d/{device.pk}/{port}/") for port in ports or []
                            if isinstance(port, int) and protocol.web_port_allowed(port)]
    return render(request, "devices/list.html", {"devices": devices,
                                                 "device_web_active": device_web_active(request.user)})
