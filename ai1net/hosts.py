"""Where device web is served, and what keeps a device's pages away from the platform.

A page under ``/d/<device>/<port>/`` comes from a service on the user's machine: whatever it is, its
script runs with the origin it is served from. Two setups:

- ``AI1NET_DEVICE_WEB_HOST`` set (``settings.DEVICE_WEB_HOST``, e.g. ``dw.ai1net.example``): device web
  lives on that host only. There, everything but ``/d/…``, the login flow, ``/static/…`` and
  ``/healthz`` is 404 (HTTP: ``device_web_host_middleware``; WebSockets: ``websocket_host_guard``; ``/d/``
  itself: the first gate, ``devices.web.gates``); on the platform's host ``/d/…`` redirects there.
  Sessions are per host, so a device page holds at most a session of that host, which reaches
  nothing but the same user's device web.
- unset (the embedded default, one host): device pages share the platform's origin. The platform
  refuses requests that say they come from a ``/d/`` document (``from_device_page``), and ``/d/``
  responses get ``Cross-Origin-Opener-Policy: same-origin`` and ``Referrer-Policy: same-origin``. That
  stops pages that do not try to hide; a hostile one can (``referrerPolicy: "origin"``): only the
  separate host isolates, and ``check --deploy`` says so (ai1net.W001).
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

from asgiref.sync import iscoroutinefunction
from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseNotFound, HttpResponseRedirect, JsonResponse
from django.http.request import split_domain_port
from django.utils.decorators import sync_and_async_middleware

DEVICE_WEB_PREFIX = "/d/"
# What the device-web host serves besides /d/: logging in there (and out), its assets, the health check.
DEVICE_WEB_HOST_PATHS = re.compile(r"^/(?:d/|accounts/login/|accounts/logout/|static/|healthz$)")
UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def hostname(host: str) -> str:
    """``Host`` header (or setting) -> the lower-case name without the port."""
    return split_domain_port(host or "")[0]


def separate() -> bool:
    return bool(settings.DEVICE_WEB_HOST)


def is_device_web_host(host: str | None) -> bool:
    return separate() and hostname(host or "") == hostname(settings.DEVICE_WEB_HOST)


def device_web_origin(scheme: str, request_host: str) -> str:
    """``scheme://host[:port]`` of device web: the platform's scheme (``AI1NET_PUBLIC_URL``'s, else the
    request's) and, when the setting names no port, the port the request came to."""
    if settings.PUBLIC_URL:
        scheme = urlsplit(settings.PUBLIC_URL).scheme or scheme
    host = settings.DEVICE_WEB_HOST
    if not split_domain_port(host)[1]:
        port = split_domain_port(request_host or "")[1]
        host = f"{host}:{port}" if port else host
    return f"{scheme}://{host}"


def device_web_url(scheme: str, request_host: str, path: str) -> str:
    """Where ``/d/…`` (``path``, with its query) is served: relative on one host, absolute otherwise."""
    return device_web_origin(scheme, request_host) + path if separate() else path


def platform_home() -> str:
    """Where to send someone after logging in on the device-web host without a ``next``."""
    return f"{settings.PUBLIC_URL}/" if settings.PUBLIC_URL else "/"


# --- one host: requests from device pages --------------------------------------------------------


def from_device_page(request: HttpRequest) -> bool:
    """The request says it was made by a ``/d/`` document of this origin: its ``Referer`` path is under
    ``/d/``, or a browser marks it same-origin (``Sec-Fetch-Site``) but sends no ``Referer`` at all —
    platform pages always send one (``Referrer-Policy: same-origin``), so only a page that hid its
    address does that. (``Sec-Fetch-Dest`` names the kind of request, never the document: no help.)"""
    referer = request.META.get("HTTP_REFERER", "")
    if referer:
        return urlsplit(referer).path.startswith(DEVICE_WEB_PREFIX)
    return request.META.get("HTTP_SEC_FETCH_SITE", "").lower() == "same-origin"


def _guarded(request: HttpRequest) -> bool:
    """State changes anywhere; reads of the API by script (navigations to pages stay allowed)."""
    if request.method in UNSAFE_METHODS:
        return True
    return request.path_info.startswith("/api/") and request.META.get("HTTP_SEC_FETCH_MODE", "") != "navigate"


def _refused_from_device_page(request: HttpRequest) -> HttpResponse:
    detail = "A page served from one of your devices (/d/…) may not use the platform."
    if request.path_info.startswith("/api/"):
        return JsonResponse({"error": "from_device_page", "detail": detail}, status=403)
    return HttpResponse(detail, status=403, content_type="text/plain; charset=utf-8")


def refusal(request: HttpRequest) -> HttpResponse | None:
    """What the platform answers instead of running the view, or None to go on."""
    path = request.path_info
    if separate():
        host = request.get_host()
        if is_device_web_host(host):
            return None if DEVICE_WEB_HOST_PATHS.match(path) else HttpResponseNotFound(
                b"Not found: this host serves device web only.", content_type="text/plain; charset=utf-8")
        if path.startswith(DEVICE_WEB_PREFIX):  # the ASGI app answers /d/ first; this is the Django side
            return HttpResponseRedirect(device_web_url(request.scheme, host, request.get_full_path()))
        return None
    if not path.startswith(DEVICE_WEB_PREFIX) and _guarded(request) and from_device_page(request):
        return _refused_from_device_page(request)
    return None


@sync_and_async_middleware
def device_web_host_middleware(get_response: Any) -> Any:
    """Django's half of the separation (pure checks, no I/O: sync and async alike)."""
    if iscoroutinefunction(get_response):
        async def middleware(request: HttpRequest) -> HttpResponse:
            return refusal(request) or await get_response(request)
    else:
        def middleware(request: HttpRequest) -> HttpResponse:
            return refusal(request) or get_response(request)
    return middleware


# --- WebSockets ---------------------------------------------------------------------------------


def _header(scope: dict[str, Any], name: bytes) -> str:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return value.decode("latin-1")
    return ""


def websocket_refused(scope: dict[str, Any]) -> bool:
    """With a device-web host: on it, only ``/d/`` sockets (the gates decide those); on the platform's
    host, no socket opened by a page of the device-web host (its Origin is an allowed host too)."""
    if not separate():
        return False
    if is_device_web_host(_header(scope, b"host")):
        return not scope.get("path", "").startswith(DEVICE_WEB_PREFIX)
    origin = _header(scope, b"origin")
    return bool(origin) and is_device_web_host(urlsplit(origin).netloc)


def websocket_host_guard(app: Any) -> Any:
    async def guarded(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "websocket" and websocket_refused(scope):
            message = await receive()
            if message["type"] == "websocket.connect":
                await send({"type": "websocket.close"})  # before accept: the handshake gets 403
            return
        await app(scope, receive, send)

    return guarded
