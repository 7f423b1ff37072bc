"""Where the platform may send a push: the address rules for push endpoints and ntfy topic URLs.

The platform makes outbound requests to addresses users give it (a browser's push endpoint, an ntfy
topic), so both go through one check against server-side request forgery:

- ``https://`` only, no user name or password in the URL, no fragment, at most 1024 characters;
- the host must not be, or resolve to, a loopback, private, link-local, multicast or otherwise
  non-global address (checked when the target is saved, and again before every send, so a name that
  later points inside is refused then);
- with ``NOTIFY_ALLOW_PRIVATE_TARGETS`` (on while debug is on) plain ``http://`` and non-global
  addresses are allowed, for local push services and ntfy servers.

Redirects are never followed. What remains is a name that changes its answer between the check and the
connection (DNS rebinding); with debug off such a request still goes only where the name pointed a
moment earlier, and its response is never shown to the user.
"""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

from django.conf import settings

from ai1net.exceptions import ValidationFailed

MAX_URL_CHARS = 1024


def _allow_private() -> bool:
    return bool(settings.NOTIFY_ALLOW_PRIVATE_TARGETS)


def check_url(url: object, *, field: str) -> str:
    """The URL's shape: scheme, no credentials, a host, a literal address that is global. Returns it."""
    if not isinstance(url, str) or not url or len(url) > MAX_URL_CHARS:
        raise ValidationFailed(f"{field} must be a URL of at most {MAX_URL_CHARS} characters.", code="bad_target")
    if any(ch.isspace() or ord(ch) < 0x20 for ch in url):
        raise ValidationFailed(f"{field} must not contain spaces or control characters.", code="bad_target")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        raise ValidationFailed(f"{field} is not a valid URL.", code="bad_target") from None
    allowed_schemes = {"https", "http"} if _allow_private() else {"https"}
    if parts.scheme not in allowed_schemes:
        raise ValidationFailed(f"{field} must be an https:// URL.", code="bad_target")
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        raise ValidationFailed(f"{field} must not contain a user name or password.", code="bad_target")
    if not parts.hostname or parts.fragment:
        raise ValidationFailed(f"{field} needs a host and no #fragment.", code="bad_target")
    literal = _literal_address(parts.hostname)
    if literal is not None and not _address_allowed(literal):
        raise ValidationFailed(f"{field} points at a private or local address.", code="private_target")
    if literal is None and not _allow_private() and _looks_local(parts.hostname):
        raise ValidationFailed(f"{field} points at a private or local address.", code="private_target")
    return url


def check_resolves_public(url: str, *, field: str) -> None:
    """Every address the host resolves to must be global (unless private targets are allowed).

    A name that does not resolve right now passes here; the check before each send refuses it then.
    """
    if _allow_private():
        return
    hostname = urlsplit(url).hostname or ""
    for address in resolve(hostname):
        if not _address_allowed(address):
            raise ValidationFailed(f"{field} points at a private or local address.", code="private_target")


def send_allowed(url: str) -> bool:
    """The check right before a send: the URL's shape and every address its host resolves to now."""
    try:
        check_url(url, field="target")
    except ValidationFailed:
        return False
    if _allow_private():
        return True
    addresses = resolve(urlsplit(url).hostname or "")
    return bool(addresses) and all(_address_allowed(address) for address in addresses)


def resolve(hostname: str) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    literal = _literal_address(hostname)
    if literal is not None:
        return [literal]
    try:
        infos = socket.getaddrinfo(hostname, 443, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return []
    found = []
    for info in infos:
        try:
            found.append(ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]))
        except ValueError:
            continue
    return found


def _literal_address(hostname: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(hostname.strip("[]"))
    except ValueError:
        pass
    try:  # inet_aton's forms (127.1, 0x7f.1, 2130706433) name addresses too
        return ipaddress.IPv4Address(socket.inet_aton(hostname))
    except (OSError, ValueError):
        return None


def _address_allowed(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if _allow_private():
        return True
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_global and not address.is_multicast


def _looks_local(hostname: str) -> bool:
    name = hostname.lower().rstrip(".")
    return name == "localhost" or name.endswith((".localhost", ".local", ".internal", ".localdomain"))
