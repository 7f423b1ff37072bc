"""The four gates of device web, in order, in one function used by the HTTP and WebSocket paths.

1. the platform switch (``AI1NET_DEVICE_WEB``): off -> 503 ``device_web_off`` (an emergency stop, said
   plainly, rather than pretending nothing is there); and, with ``AI1NET_DEVICE_WEB_HOST`` set, the
   request came to that host (elsewhere -> ``DeviceWebElsewhere``: HTTP redirects there, a WebSocket is
   refused; see ai1net.hosts);
2. a logged-in user (OTP-verified when they have a confirmed OTP device; no session -> 401, pages
   redirect to the login) who owns the device and has device web on (someone else's or unknown
   device, or the user's switch off -> 404);
3. the device active (revoked -> 403) and a desktop bridge (a probe -> 403);
4. the device online over its WebSocket tunnel (offline, or long polling -> 503) with that port
   declared in its hello (else 502).

``check_device_web`` reads the device scoped to its owner with whether the owner has two-factor in one
query (``_device_row``); the session's OTP verification is read only for users who have it.

``device_web_fast`` is the HTTP path's common case in one raw query, session included: the session row,
the device and its owner, and the owner's two-factor. It answers only "all four gates pass" (the user is
the session's, verified as ``django.contrib.auth.get_user`` does: the model backend, the session hash
under the current secret, an active user); anything else returns None and the caller runs the full
checks above, so every refusal is the same as before, word for word.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from importlib import import_module
from types import MappingProxyType
from typing import Any

from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
from django.core.exceptions import ValidationError
from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.db.models import Exists, OuterRef
from django.utils import timezone
from django.utils.crypto import constant_time_compare
from django_otp.plugins.otp_totp.models import TOTPDevice

from ai1net import hosts
from ai1net.accounts.models import BackupCodeDevice, User
from ai1net.accounts.selectors import NEEDS_OTP_PARAMS_FOR_COLUMN, device_web_active, needs_otp_sql, otp_session_ok
from ai1net.db_threads import DatabaseThreads, default_count
from ai1net.exceptions import ApplicationError, Forbidden, NotAuthenticated, NotFound, Unavailable
from clients import protocol
from devices.errors import DeviceOffline
from devices.models import Device, is_tunnel_channel
from devices.selectors import access_device

# The gates' trip to the database is self-contained (the session, the user, the device): it runs in
# threads of its own rather than on Django's one thread-sensitive thread, with a cheaper hop
# (ai1net.db_threads). Every device-web request and socket makes it before its first byte.
gate_threads = DatabaseThreads(default_count(), "device-web-db")


class DeviceWebOff(Unavailable):
    code = "device_web_off"
    default_detail = "Device web is switched off on this platform for now."


class DeviceWebElsewhere(ApplicationError):
    """Device web has a host of its own and this request came to the platform's: HTTP answers 302 to
    the same path there (devices.web.streams.error_response)."""

    code = "device_web_elsewhere"
    status = 302
    default_detail = "Device web is served on its own host."


class PortNotExposed(ApplicationError):
    code = "port_not_exposed"
    status = 502
    default_detail = "The device does not expose this port."


def check_device_web(user: Any, device_id: Any, port: Any, *, session: Any = None, host: str | None = None) -> Device:
    """The device the user may reach on ``port``, or the ApplicationError that says why not.

    ``session`` is the user's session (for the OTP rule); pass None only where OTP is checked already.
    ``host`` is the request's Host header (checked only when device web has a host of its own).
    """
    if not settings.DEVICE_WEB_ENABLED:
        raise DeviceWebOff()
    if hosts.separate() and not hosts.is_device_web_host(host):
        raise DeviceWebElsewhere()
    if user is None or not getattr(user, "is_authenticated", False):
        raise NotAuthenticated("Log in to reach your devices.")
    device = _device_row(user, device_id)
    needs_otp = device is None or device.owner_needs_otp  # not found: otp_session_ok reads it itself
    if session is not None and needs_otp and not otp_session_ok(user, session):
        raise NotAuthenticated("Enter your two-factor code first.", code="otp_required")
    if not device_web_active(user):
        raise NotFound("No such device.")
    if device is None:
        device = access_device(user=user, device_id=device_id)  # raises the 404 access_device gives
    if device.status != Device.Status.ACTIVE:
        raise Forbidden(f"{device.name} was revoked; pair it again.", code="device_revoked")
    if device.kind != Device.Kind.BRIDGE:
        raise Forbidden(f"{device.name} is a probe; device web reaches desktop bridges only.", code="not_a_bridge")
    if not device.is_online:
        raise DeviceOffline(f"{device.name} is offline: its bridge is not connected.")
    if device.is_long_polling:  # streams need the WebSocket tunnel; the HTTP fallback carries none
        raise DeviceOffline(f"{device.name} is connected over the HTTP fallback only; device web needs its "
                            "WebSocket tunnel.", code="device_long_polling")
    number = _port(port)
    if number is None or number not in (device.ports or []):
        raise PortNotExposed(
            f"{device.name} does not expose port {port}. Start its bridge with "
            f"`ai1net-bridge run --expose {port}` (ports {protocol.WEB_PORT_MIN}-{protocol.WEB_PORT_MAX})."
        )
    return device


def _device_row(user: Any, device_id: Any) -> Device | None:
    """The user's device ``device_id`` annotated with ``owner_needs_otp`` (the rule of
    ai1net.accounts.selectors.user_needs_otp), in one query; None when there is no such device of theirs."""
    totp = TOTPDevice.objects.filter(user=OuterRef("owner_id"), confirmed=True)
    backup = BackupCodeDevice.objects.filter(user=OuterRef("owner_id"), confirmed=True, codes__isnull=False)
    try:
        return (Device.objects.filter(owner=user, pk=device_id)
                .annotate(owner_needs_otp=Exists(totp) | Exists(backup)).first())
    except (ValueError, TypeError, ValidationError):
        return None


MODEL_BACKEND = "django.contrib.auth.backends.ModelBackend"
DB_SESSIONS = {"django.contrib.sessions.backends.db", "ai1net.accounts.sessions"}  # a session table to join
_USER_FIELDS = ("id", "password", "otp_epoch", "is_active", "device_web_enabled")


_DEVICE_FIELDS = ("id", "owner_id", "name", "kind", "status", "channel_name", "relay", "capabilities", "ports")


@functools.cache
def _fast_sql(vendor: str, engine: str) -> str:
    """The query of ``device_web_fast`` for this database vendor and session engine (one of DB_SESSIONS),
    built once (quoting from the backend)."""
    q = connection.ops.quote_name
    device, user = Device._meta, User._meta
    session = import_module(engine).SessionStore.get_model_class()._meta
    columns = ", ".join(f"d.{q(device.get_field(name).column)}" for name in _DEVICE_FIELDS)
    users = ", ".join(f"u.{q(user.get_field(name).column)}" for name in _USER_FIELDS)
    needs_otp = needs_otp_sql(vendor, f"d.{q(device.get_field('owner').column)}")
    return (
        f"SELECT {columns}, {users}, s.{q('session_data')}, ({needs_otp}) "  # noqa: S608 - names from _meta
        f"FROM {q(session.db_table)} s, {q(device.db_table)} d INNER JOIN {q(user.db_table)} u "
        f"ON u.{q('id')} = d.{q('owner_id')} "
        f"WHERE s.{q('session_key')} = %s AND s.{q('expire_date')} > %s AND d.{q('id')} = %s"
    )


def device_web_fast(session: Any, device_id: Any, port: Any) -> tuple[User, Device] | None:
    """(user, device) when the session's user passes all four gates for ``device_id`` and ``port``, in one
    query; None for anything else (run ``auth.get_user`` and ``check_device_web`` then)."""
    key = getattr(session, "session_key", None)
    number = _port(port)
    if (not key or number is None or not settings.DEVICE_WEB_ENABLED or hosts.separate()
            or settings.SESSION_ENGINE not in DB_SESSIONS or MODEL_BACKEND not in settings.AUTHENTICATION_BACKENDS):
        return None
    conn = connections[DEFAULT_DB_ALIAS]  # the connection itself: each read through the proxy asks asgiref's Local
    pk_field = Device._meta.pk
    try:
        device_pk = pk_field.to_python(device_id)
        pk = pk_field.get_db_prep_value(device_pk, conn)
    except (ValidationError, ValueError, TypeError):
        return None
    now = conn.ops.adapt_datetimefield_value(timezone.now())
    with conn.cursor() as cursor:
        cursor.execute(_fast_sql(conn.vendor, settings.SESSION_ENGINE), [*NEEDS_OTP_PARAMS_FOR_COLUMN, key, now, pk])
        rows = cursor.fetchall()
    if len(rows) != 1:
        return None
    row = rows[0]
    values = dict(zip(_DEVICE_FIELDS, row, strict=False))
    user_values = dict(zip(_USER_FIELDS, row[len(_DEVICE_FIELDS):], strict=False))
    session_data, needs_otp = row[-2], row[-1]
    # What the gates, the stream and the session hash read (of the user: nothing that needs a database
    # converter); the rest of either row is deferred, loaded if anything asks.
    names = _loaded_names(User, _USER_FIELDS)
    user = User.from_db(conn.alias, names, [user_values[name] for name in names])
    user.is_active, user.device_web_enabled = bool(user.is_active), bool(user.device_web_enabled)
    # Empty when tampered with or unreadable. A lazy session's __class__ is its store's.
    data = _session_data(session.__class__, session_data, settings.SECRET_KEY, tuple(settings.SECRET_KEY_FALLBACKS))
    session_hash = data.get(HASH_SESSION_KEY)
    if (str(data.get(SESSION_KEY)) != str(user.pk) or data.get(BACKEND_SESSION_KEY) != MODEL_BACKEND
            or not session_hash or not constant_time_compare(session_hash, user.get_session_auth_hash())):
        return None
    if not user.is_active or not device_web_active(user) or needs_otp:
        return None
    values["id"] = device_pk  # the row's own: the query matched it
    for name in ("capabilities", "ports"):
        values[name] = Device._meta.get_field(name).from_db_value(values[name], None, conn)
    names = _loaded_names(Device, _DEVICE_FIELDS)
    device = Device.from_db(conn.alias, names, [values[name] for name in names])
    if (device.status != Device.Status.ACTIVE or device.kind != Device.Kind.BRIDGE
            or not is_tunnel_channel(device.channel_name) or number not in (device.ports or [])):
        return None
    user.backend = MODEL_BACKEND
    device.owner = user
    return user, device


@functools.cache
def _loaded_names(model: type, names: tuple[str, ...]) -> list[str]:
    """``names`` (attnames) in the order of ``model``'s concrete fields, as ``Model.from_db`` takes them."""
    return [field.attname for field in model._meta.concrete_fields if field.attname in names]


@functools.lru_cache(maxsize=1024)
def _session_data(store: type, session_data: str, secret: str, fallbacks: tuple[str, ...]) -> Mapping[str, Any]:
    """``store().decode(session_data)``, read-only, kept per data and signing keys (``secret`` and ``fallbacks``,
    the settings the decode checks the signature with, only key the cache): a browser's requests through device
    web carry the same session, and its decode (the signature's HMAC, zlib, JSON) was a third of this gate's time
    in a loop. A decode depends on nothing else, so what is kept is what a decode would give now."""
    return MappingProxyType(store().decode(session_data))


def _port(value: Any) -> int | None:
    text = str(value)
    if not text.isdigit() or len(text) > 5:
        return None
    number = int(text)
    return number if protocol.web_port_allowed(number) else None
