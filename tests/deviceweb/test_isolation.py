"""A device's pages must not get the platform's session: device web on a host of its own
(AI1NET_DEVICE_WEB_HOST), and, on one host, the platform refusing requests made by /d/ documents."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
import pytest
from asgiref.sync import async_to_sync
from channels.testing import HttpCommunicator, WebsocketCommunicator
from django.test import Client

from ai1net import hosts
from ai1net.asgi import application
from ai1net.checks import device_web_host_check
from devices.web import streams
from tests.accounts.helpers import code_step, password_step, totp_code, totp_device
from tests.deviceweb.support import Bridge, Upstream, enable_device_web
from tests.deviceweb.test_gates import PORT, online_bridge, session_cookie
from tests.e2e_support import ROOT, Daphne, free_port
from tests.mobile.factories import ask, bridge_for, enable_mobile

DW = "dw.testserver"


@pytest.fixture
def dw_host(settings):
    settings.DEVICE_WEB_HOST = DW
    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, DW]
    return DW


def asgi_get(path: str, host: str, *, cookie: bytes | None = None, html: bool = False) -> tuple[int, dict, bytes]:
    headers = [(b"host", host.encode()), (b"accept", b"text/html" if html else b"application/json")]
    if cookie:
        headers.append((b"cookie", cookie))

    @async_to_sync
    async def run():
        return await HttpCommunicator(application, "GET", path, headers=headers).get_response(timeout=5)

    response = run()
    return response["status"], {k.decode(): v.decode() for k, v in response["headers"]}, response["body"]


# --- a host of its own ----------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_device_web_host_answers_404_to_every_platform_path(client, user, dw_host):
    client.force_login(user)  # even with a session of that host
    for path in ("/", "/devices/", "/m/", "/studio/", "/accounts/", "/admin/", "/api/mobile/pending",
                 "/api/schema/", "/pair/", "/downloads/ai1net-bridge.pyz", "/ws/devices", "/accounts/tokens/"):
        assert client.get(path, HTTP_HOST=DW).status_code == 404, path
    for path in ("/api/mobile/answer", "/api/devices/pairings", "/accounts/mobile-reply/"):
        assert client.post(path, {}, HTTP_HOST=DW).status_code == 404, path
    # What that host does serve: the login (with its code step), its assets, the health check.
    assert client.get("/healthz", HTTP_HOST=DW).status_code == 200
    assert client.get("/static/css/app.css", HTTP_HOST=DW).status_code == 200
    assert Client().get("/accounts/login/", HTTP_HOST=DW).status_code == 200
    assert Client().get("/accounts/login/code/", HTTP_HOST=DW).status_code == 302  # no login under way
    # The platform's host is unchanged.
    assert client.get("/devices/").status_code == 200


@pytest.mark.django_db(transaction=True)
def test_d_on_the_platform_host_redirects_to_the_device_web_host(user, dw_host, settings):
    enable_device_web(user)
    device = online_bridge(user)
    path = f"/d/{device.pk}/{PORT}/app/a%20b?x=1"
    # The ASGI app (what daphne runs): the first gate, before any session talk; the port is kept.
    status, headers, _ = asgi_get(path, "127.0.0.1:8000", cookie=session_cookie(user))
    assert status == 302 and headers["location"] == f"http://{DW}:8000{path}"
    settings.PUBLIC_URL = "https://ai1net.example"  # behind TLS: the platform's scheme
    assert asgi_get(path, "ai1net.example")[1]["location"] == f"https://{DW}{path}"
    # Django's side says the same (the test client never reaches the ASGI router).
    response = Client().get(path)
    assert response.status_code == 302 and response["Location"] == f"https://{DW}/d/{device.pk}/{PORT}/app/a%20b?x=1"


@pytest.mark.django_db(transaction=True)
def test_log_in_on_the_device_web_host_then_reach_the_device(user, other_user, password, dw_host, settings):
    settings.PUBLIC_URL = "http://testserver"
    enable_device_web(user)
    device = online_bridge(user)
    target = f"/d/{device.pk}/{PORT}/app"
    # No session of that host: the login, on that host, back here afterwards.
    status, headers, _ = asgi_get(target, DW, html=True)
    assert status == 302 and headers["location"] == f"/accounts/login/?next={target}"

    # Password, then the code step, all on the device-web host.
    totp = totp_device(user)
    browser = Client(HTTP_HOST=DW)
    response = password_step(browser, user.username, password, next_url=target)
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/code/?next=")
    assert browser.get(response["Location"]).status_code == 200
    response = code_step(browser, totp_code(totp), next_url=target)
    assert response.status_code == 302 and response["Location"] == target

    # That session gets through every gate on that host (to the port gate: 20002 is not declared)...
    cookie = f"sessionid={browser.cookies['sessionid'].value}".encode()
    status, _, body = asgi_get(f"/d/{device.pk}/20002/", DW, cookie=cookie)
    assert (status, json.loads(body)["error"]) == (502, "port_not_exposed")
    # ... and nowhere else: the platform's pages and API are not on that host.
    assert browser.get("/api/mobile/pending").status_code == 404
    # Without a next, the login on that host leads to the platform's home page (that host has none).
    response = password_step(Client(HTTP_HOST=DW), other_user.username, password)
    assert response.status_code == 302 and response["Location"] == "http://testserver/"


@pytest.mark.django_db(transaction=True)
def test_websockets_follow_the_same_split(user, dw_host):
    enable_device_web(user)
    device = online_bridge(user)
    cookie = session_cookie(user)

    @async_to_sync
    async def opens(path: str, host: str, origin: str) -> bool:
        comm = WebsocketCommunicator(application, path, headers=[
            (b"host", host.encode()), (b"origin", origin.encode()), (b"cookie", cookie)])
        connected, _ = await comm.connect(timeout=5)
        await comm.disconnect()
        return connected

    assert opens("/ws/devices", "testserver", "http://testserver")  # the platform's own socket, as before
    assert not opens("/ws/devices", DW, "http://testserver")  # not on the device-web host
    assert not opens(f"/d/{device.pk}/{PORT}/ws", "testserver", "http://testserver")  # /d/ only there
    # A page of the device-web host (an allowed host, so the origin check alone would let it in) may
    # not open the platform's sockets.
    scope = {"type": "websocket", "path": "/ws/devices",
             "headers": [(b"host", b"testserver"), (b"origin", f"https://{DW}".encode())]}
    assert hosts.websocket_refused(scope)
    assert not hosts.websocket_refused(dict(scope, headers=[(b"host", b"testserver"), (b"origin", b"https://testserver")]))
    assert not hosts.websocket_refused(dict(scope, path=f"/d/{device.pk}/{PORT}/ws", headers=[(b"host", DW.encode())]))


def test_the_device_web_host_joins_the_allowed_hosts_and_must_be_a_host():
    def settings_of(**env: str) -> subprocess.CompletedProcess:
        code = "import django; django.setup(); from django.conf import settings; print(settings.ALLOWED_HOSTS)"
        environ = {k: v for k, v in os.environ.items() if not k.startswith(("AI1NET_", "DJANGO_"))}
        environ.update(DJANGO_SETTINGS_MODULE="ai1net.settings", **env)
        return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=environ, capture_output=True, text=True,
                              timeout=60, check=False)

    done = settings_of(AI1NET_DEVICE_WEB_HOST="DW.localhost:8000")
    assert done.returncode == 0 and "'dw.localhost'" in done.stdout, done.stderr
    assert "not a URL" in settings_of(AI1NET_DEVICE_WEB_HOST="https://dw.localhost").stderr
    assert "must differ" in settings_of(AI1NET_DEVICE_WEB_HOST="ai1net.example",
                                        AI1NET_PUBLIC_URL="https://ai1net.example").stderr


@pytest.mark.django_db
def test_the_devices_page_links_exposed_ports(client, user, settings):
    enable_device_web(user)
    device = online_bridge(user, ports=(20001, 20007))
    online_bridge(user, ports=(20003,), kind="probe", name="probe")  # probes serve no device web
    client.force_login(user)
    page = client.get("/devices/").content.decode()
    assert f'href="/d/{device.pk}/20001/"' in page and f'href="/d/{device.pk}/20007/"' in page
    assert "/20003/" not in page
    settings.DEVICE_WEB_HOST = DW
    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, DW]
    page = client.get("/devices/").content.decode()
    assert f'href="http://{DW}/d/{device.pk}/20001/"' in page


# --- one host: what the platform does about it ---------------------------------------------------


@pytest.mark.django_db
def test_on_one_host_a_device_page_may_not_use_the_platform(client, user):
    mobile_user = enable_mobile(user)
    bridge = bridge_for(mobile_user)
    client.force_login(mobile_user)
    question, nonce = ask(bridge)
    body = {"question_id": str(question.pk), "nonce": nonce, "answers": {"Which framework?": ["Vue"]}}

    def answer(**headers):
        return client.post("/api/mobile/answer", body, content_type="application/json", **headers)

    device_page = f"http://testserver/d/{bridge.pk}/20001/index.html"
    refused = answer(HTTP_REFERER=device_page, HTTP_SEC_FETCH_SITE="same-origin", HTTP_SEC_FETCH_DEST="empty")
    assert refused.status_code == 403 and refused.json()["error"] == "from_device_page"
    # A same-origin request that hides where it comes from: only a page that hid its address does that.
    assert answer(HTTP_SEC_FETCH_SITE="same-origin").status_code == 403
    # Script reading the API from such a page; a page form posting.
    assert client.get("/api/mobile/pending", HTTP_REFERER=device_page, HTTP_SEC_FETCH_MODE="cors").status_code == 403
    assert client.post("/accounts/mobile-reply/", {"enabled": "0"}, HTTP_REFERER=device_page).status_code == 403
    # Following a link from a device page to the platform still works (a navigation, nothing changes).
    assert client.get("/devices/", HTTP_REFERER=device_page, HTTP_SEC_FETCH_MODE="navigate").status_code == 200
    # The question is still open; the phone page's own POST goes through.
    assert client.get("/api/mobile/pending").json()["questions"][0]["question_id"] == str(question.pk)
    response = answer(HTTP_REFERER="http://testserver/m/", HTTP_SEC_FETCH_SITE="same-origin")
    assert response.status_code == 200, response.content
    assert response.json() == {"state": "answered"}


def test_device_responses_on_one_host_get_no_opener_and_a_telling_referer(settings):
    raw = [["content-type", "text/html"], ["Referrer-Policy", "no-referrer"], ["cross-origin-opener-policy", "unsafe-none"],
           ["set-cookie", "sessionid=evil"], ["set-cookie", "app=1"]]
    headers = streams.response_headers(raw)
    assert (b"cross-origin-opener-policy", b"same-origin") in headers
    assert (b"referrer-policy", b"same-origin") in headers
    assert (b"referrer-policy", b"no-referrer") not in headers and (b"set-cookie", b"sessionid=evil") not in headers
    assert (b"set-cookie", b"app=1") in headers
    settings.DEVICE_WEB_HOST = DW  # on its own host the device's page keeps its own policies
    headers = streams.response_headers(raw)
    assert (b"referrer-policy", b"no-referrer") in headers and (b"cross-origin-opener-policy", b"same-origin") not in headers


@pytest.mark.parametrize("name", ["sessionid", "csrftoken", "ai1net_known_browser"])
def test_no_platform_cookie_goes_to_a_device_or_comes_from_one(name):
    scope = {"headers": [(b"cookie", f"{name}=secret; app=1".encode())], "client": ("1.2.3.4", 5)}
    assert ["cookie", "app=1"] in streams.forward_headers(scope, "/d/x/80")
    assert (b"set-cookie", f"{name}=planted".encode()) not in streams.response_headers(
        [["set-cookie", f"{name}=planted"]])


def test_check_deploy_warns_when_device_web_shares_the_platform_host(settings):
    settings.DEBUG = False
    settings.DEVICE_WEB_ENABLED = True
    settings.DEVICE_WEB_HOST = ""
    assert [w.id for w in device_web_host_check()] == ["ai1net.W001"]
    settings.DEVICE_WEB_HOST = DW
    assert device_web_host_check() == []
    settings.DEVICE_WEB_HOST = ""
    settings.DEVICE_WEB_ENABLED = False
    assert device_web_host_check() == []


# --- end to end: one daphne, two host names -------------------------------------------------------


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_two_hosts_on_one_daphne(tmp_path, user, password):
    enable_device_web(user)
    port = free_port()
    dw = f"dw.localhost:{port}"
    server = Daphne(tmp_path, port=port, AI1NET_DEVICE_WEB_HOST="dw.localhost",
                    AI1NET_PUBLIC_URL=f"http://127.0.0.1:{port}", AI1NET_HEARTBEAT_SEC="2")
    upstream = Upstream(tmp_path)
    bridge = None
    try:
        bridge = Bridge(server, user, tmp_path / "home", [upstream.port])
        target = f"{bridge.prefix}/{upstream.port}/echo?q=1"

        with httpx.Client(base_url=server.url, timeout=20) as platform:
            platform.get("/accounts/login/").raise_for_status()
            response = platform.post("/accounts/login/", data={
                "username": user.username, "password": password, "csrfmiddlewaretoken": platform.cookies["csrftoken"]})
            assert response.status_code == 302
            # The platform's host serves no device web, whatever the session: it points to the other host.
            response = platform.get(target)
            assert response.status_code == 302 and response.headers["location"] == f"http://{dw}{target}"
            assert platform.get("/api/devices").status_code == 200

        with httpx.Client(base_url=server.url, headers={"Host": dw}, timeout=20) as web:
            assert web.get("/healthz").status_code == 200
            for path in ("/", "/api/mobile/pending", "/devices/", "/admin/"):
                assert web.get(path).status_code == 404, path
            # Log in there once, sent back to the device page.
            page = web.get(target, headers={"Accept": "text/html"})
            assert page.status_code == 302 and page.headers["location"].startswith("/accounts/login/?next=/d/")
            web.get(page.headers["location"]).raise_for_status()
            response = web.post("/accounts/login/", data={
                "username": user.username, "password": password, "next": target,
                "csrfmiddlewaretoken": web.cookies["csrftoken"]})
            assert response.status_code == 302 and response.headers["location"] == target
            response = web.get(target)
            assert response.status_code == 200, response.text
            echoed = response.json()
            assert echoed["target"] == "/echo?q=1"
            assert ["x-forwarded-host", dw] in [[k.lower(), v] for k, v in echoed["headers"]]
            assert "cross-origin-opener-policy" not in response.headers  # its own origin: its own policies
            # That session reaches nothing of the platform.
            assert web.get("/api/devices").status_code == 404
            assert web.post("/api/mobile/answer", json={}).status_code == 404
    finally:
        if bridge is not None:
            bridge.stop()
        upstream.stop()
        server.stop()
