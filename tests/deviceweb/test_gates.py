"""The four gates of device web, in order, for HTTP and WebSocket (in process, no device needed:
every request here is answered before anything is sent to a tunnel)."""

from __future__ import annotations

import json
import uuid
from importlib import import_module

import pytest
from asgiref.sync import async_to_sync
from channels.testing import HttpCommunicator, WebsocketCommunicator
from django.conf import settings as django_settings
from django.contrib.auth import SESSION_KEY as SESSION_KEY_NAME
from django.test import Client
from django.utils import timezone

from ai1net.asgi import application
from ai1net.exceptions import ApplicationError
from devices import services
from devices.models import LONGPOLL_PREFIX, Device
from devices.web.gates import _session_data, check_device_web, device_web_fast
from tests.accounts.helpers import totp_device
from tests.deviceweb.support import enable_device_web

pytestmark = pytest.mark.django_db(transaction=True)

PORT = 20001


def online_bridge(owner, *, ports=(PORT,), kind=Device.Kind.BRIDGE, name="desk") -> Device:
    device, _ = services.device_create(owner=owner, name=name, kind=kind)
    Device.objects.filter(pk=device.pk).update(channel_name="specific.test!nobody", ports=list(ports))
    return Device.objects.get(pk=device.pk)


def session_cookie(user) -> bytes:
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}".encode()


def fast_gate_world(user) -> tuple[type, Device, str]:
    """For ``device_web_fast``: the session store's class, an online bridge of ``user`` with device web on, and
    ``user``'s session key."""
    enable_device_web(user)
    store = import_module(django_settings.SESSION_ENGINE).SessionStore
    return store, online_bridge(user), session_cookie(user).decode().split("=", 1)[1]


def get(path: str, *, cookie: bytes | None = None, html: bool = False, headers=()) -> tuple[int, dict, bytes]:
    return async_to_sync(_get)(path, cookie=cookie, html=html, headers=headers)


async def _get(path: str, *, cookie: bytes | None, html: bool, headers) -> tuple[int, dict, bytes]:
    sent = [(b"host", b"127.0.0.1"), *headers]
    if cookie:
        sent.append((b"cookie", cookie))
    sent.append((b"accept", b"text/html,application/xhtml+xml" if html else b"application/json"))
    comm = HttpCommunicator(application, "GET", path, headers=sent)
    response = await comm.get_response(timeout=5)
    return response["status"], {k.decode(): v.decode() for k, v in response["headers"]}, response["body"]


def error_of(body: bytes) -> str:
    return json.loads(body)["error"]


def test_each_gate_answers_in_order(user, other_user, settings):
    enable_device_web(user)
    device = online_bridge(user)
    cookie = session_cookie(user)
    path = f"/d/{device.pk}/{PORT}/app?x=1"

    # 1. The platform switch comes first, whoever asks.
    settings.DEVICE_WEB_ENABLED = False
    status, _, body = get(path)
    assert (status, error_of(body)) == (503, "device_web_off")
    status, headers, body = get(path, cookie=cookie, html=True)
    assert status == 503 and "switched off" in body.decode() and headers["content-type"].startswith("text/html")
    settings.DEVICE_WEB_ENABLED = True

    # 2. A session: none -> 401 for API callers, the login page (back here afterwards) for browsers.
    status, _, body = get(path)
    assert (status, error_of(body)) == (401, "not_authenticated")
    status, headers, _ = get(path, html=True)
    assert status == 302 and headers["location"] == f"/accounts/login/?next=/d/{device.pk}/{PORT}/app%3Fx%3D1"

    # ... the owner's own device: someone else's (or an unknown one) is not there at all.
    enable_device_web(other_user)
    stranger = session_cookie(other_user)
    status, _, body = get(path, cookie=stranger)
    assert (status, error_of(body)) == (404, "not_found")
    assert (get(f"/d/{uuid.uuid4()}/{PORT}/", cookie=cookie))[0] == 404
    assert (get(f"/d/not-a-uuid/{PORT}/", cookie=cookie))[0] == 404

    # ... with the user's own switch on: off -> 404, as if device web did not exist for them.
    user.device_web_enabled = False
    user.save(update_fields=["device_web_enabled"])
    assert (get(path, cookie=cookie))[0] == 404
    enable_device_web(user)

    # 3. An active bridge: a probe or a revoked device -> 403 saying which.
    probe = online_bridge(user, kind=Device.Kind.PROBE, name="probe")
    status, _, body = get(f"/d/{probe.pk}/{PORT}/", cookie=cookie)
    assert (status, error_of(body)) == (403, "not_a_bridge")
    revoked = online_bridge(user, name="old")
    Device.objects.filter(pk=revoked.pk).update(status=Device.Status.REVOKED)
    status, _, body = get(f"/d/{revoked.pk}/{PORT}/", cookie=cookie)
    assert (status, error_of(body)) == (403, "device_revoked")

    # 4. Online, with that port declared: offline -> 503, an undeclared port -> 502, each with a plain page.
    status, _, body = get(f"/d/{device.pk}/20002/", cookie=cookie)
    assert (status, error_of(body)) == (502, "port_not_exposed")
    status, _, body = get(f"/d/{device.pk}/20002/", cookie=cookie, html=True)
    assert status == 502 and "does not expose port 20002" in body.decode() and "--expose 20002" in body.decode()
    assert (get(f"/d/{device.pk}/8080/", cookie=cookie))[0] == 502  # outside 20000-20999, never served
    Device.objects.filter(pk=device.pk).update(channel_name="")
    status, _, body = get(path, cookie=cookie, html=True)
    assert status == 503 and "offline" in body.decode()
    Device.objects.filter(pk=device.pk).update(channel_name=LONGPOLL_PREFIX + "x", last_seen_at=timezone.now())
    status, _, body = get(path, cookie=cookie)
    assert (status, error_of(body)) == (503, "device_long_polling")


def test_an_unverified_two_factor_session_is_not_enough(user):
    enable_device_web(user)
    device = online_bridge(user)
    totp_device(user)  # enrolled, but this session never entered a code
    status, _, body = get(f"/d/{device.pk}/{PORT}/", cookie=session_cookie(user))
    assert (status, error_of(body)) == (401, "otp_required")


def test_a_request_body_over_the_cap_is_refused_up_front(user, settings):
    enable_device_web(user)
    device = online_bridge(user)
    settings.DEVICE_WEB_MAX_REQUEST_BYTES = 1000
    status, _, body = get(f"/d/{device.pk}/{PORT}/", cookie=session_cookie(user),
                                headers=[(b"content-length", b"1001")])
    assert (status, error_of(body)) == (413, "too_large")


def test_websocket_handshakes_pass_the_same_gates(user, other_user):
    enable_device_web(user)
    enable_device_web(other_user)
    device = online_bridge(user)

    @async_to_sync
    async def handshake(path: str, cookie: bytes | None) -> bool:
        headers = [(b"host", b"127.0.0.1"), (b"origin", b"http://127.0.0.1")]
        if cookie:
            headers.append((b"cookie", cookie))
        comm = WebsocketCommunicator(application, path, headers=headers)
        connected, _ = await comm.connect(timeout=5)
        await comm.disconnect()
        return connected

    assert not handshake(f"/d/{device.pk}/{PORT}/ws", None)
    assert not handshake(f"/d/{device.pk}/{PORT}/ws", session_cookie(other_user))
    assert not handshake(f"/d/{device.pk}/20002/ws", session_cookie(user))
    Device.objects.filter(pk=device.pk).update(channel_name="")
    assert not handshake(f"/d/{device.pk}/{PORT}/ws", session_cookie(user))


def test_check_device_web_is_one_function_with_a_fixed_order(user, other_user, settings):
    enable_device_web(user)
    device = online_bridge(user)
    # The platform switch wins over everything after it, a missing user over ownership, and so on.
    settings.DEVICE_WEB_ENABLED = False
    with pytest.raises(ApplicationError) as caught:
        check_device_web(None, device.pk, PORT)
    assert caught.value.code == "device_web_off"
    settings.DEVICE_WEB_ENABLED = True
    with pytest.raises(ApplicationError) as caught:
        check_device_web(None, device.pk, PORT)
    assert caught.value.status == 401
    with pytest.raises(ApplicationError) as caught:
        check_device_web(other_user, device.pk, 20002)  # someone else's: 404 before any port talk
    assert caught.value.status == 404
    assert check_device_web(user, device.pk, str(PORT)).pk == device.pk


def test_the_one_query_fast_path_passes_only_what_the_full_checks_pass(user, other_user, django_assert_num_queries):
    """device_web_fast answers "all gates pass" in one query, and None (the full checks run) for
    anything else: no session, someone else's device, the switch off, two-factor, a password change
    (the session hash), a logout, a probe, offline, an undeclared port."""
    from ai1net.accounts.models import BackupCode, BackupCodeDevice

    store, device, key = fast_gate_world(user)
    with django_assert_num_queries(1):
        fast = device_web_fast(store(key), str(device.pk), str(PORT))
    assert fast is not None and fast[0].pk == user.pk and fast[1].pk == device.pk
    assert fast[1].ports == [PORT] and fast[1].capabilities == []
    assert check_device_web(fast[0], device.pk, PORT).pk == device.pk

    def fast_for(key: str, device_id=device.pk, port=PORT):
        return device_web_fast(store(key), str(device_id), str(port))

    assert fast_for("nonsense") is None
    assert fast_for(key, device_id="not-a-uuid") is None
    assert fast_for(key, port=20002) is None and fast_for(key, port=8080) is None
    enable_device_web(other_user)
    assert fast_for(session_cookie(other_user).decode().split("=", 1)[1]) is None  # not theirs
    probe = online_bridge(user, kind=Device.Kind.PROBE, name="probe")
    assert fast_for(key, device_id=probe.pk) is None
    user.device_web_enabled = False
    user.save(update_fields=["device_web_enabled"])
    assert fast_for(key) is None
    enable_device_web(user)
    backup = BackupCodeDevice.objects.create(user=user, name="backup", confirmed=True)
    BackupCode.objects.create(device=backup, code_hash="x" * 64)
    assert fast_for(key) is None  # two-factor: the full checks read the session's verification
    backup.delete()
    totp = totp_device(user)
    assert fast_for(key) is None
    totp.delete()
    assert fast_for(key) is not None
    Device.objects.filter(pk=device.pk).update(channel_name="")
    assert fast_for(key) is None
    Device.objects.filter(pk=device.pk).update(channel_name="specific.test!nobody")
    user.set_password("a new password 99 horse")
    user.save()
    assert fast_for(key) is None  # the session's hash no longer matches: logged out everywhere
    fresh = session_cookie(user).decode().split("=", 1)[1]
    assert fast_for(fresh) is not None
    store(fresh).delete()
    assert fast_for(fresh) is None  # logged out


def test_the_fast_path_decodes_a_session_once_and_only_under_the_keys_that_signed_it(user, settings):
    """The gate keeps a session's decoded data per data and signing keys (``_session_data``): the same session's
    next request reuses it, and under another secret the same data decodes anew, to nothing, as Django's would."""
    store, device, key = fast_gate_world(user)
    _session_data.cache_clear()
    for _ in range(3):
        assert device_web_fast(store(key), str(device.pk), str(PORT)) is not None
    assert (_session_data.cache_info().misses, _session_data.cache_info().hits) == (1, 2)
    data = store.get_model_class().objects.get(session_key=key).session_data
    kept = _session_data(store, data, settings.SECRET_KEY, tuple(settings.SECRET_KEY_FALLBACKS))
    assert kept[SESSION_KEY_NAME] == str(user.pk)
    with pytest.raises(TypeError):
        kept[SESSION_KEY_NAME] = "someone else"  # read-only: nobody changes what the next request reads

    settings.SECRET_KEY = "a secret that did not sign this session " + "x" * 20
    assert device_web_fast(store(key), str(device.pk), str(PORT)) is None
    assert _session_data(store, data, settings.SECRET_KEY, ()) == {}
