"""Notification writes and sends: subscriptions, the ntfy target, and the "an agent is waiting" notice.

The notice reveals nothing: its only content is a fixed sentence and the number of questions waiting
(``waiting_payload``). No question text, header, option, session title, path or command ever goes to a
push service or an ntfy server. Sends run off the request path (``notify.dispatch``), never raise into a
caller, and give up after ``NOTIFY_TIMEOUT_SEC`` per request.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
from typing import Any
from urllib.parse import urlsplit

import httpx
import requests
from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone
from pywebpush import WebPushException, webpush

from ai1net.accounts.services import audit_record
from ai1net.exceptions import Conflict, NotFound, ValidationFailed
from notify import selectors, targets, vapid
from notify.models import NtfyTarget, PushSubscription

logger = logging.getLogger(__name__)

MAX_SUBSCRIPTIONS_PER_USER = 20
TITLE = "ai1net"
PHONE_PATH = "/m/"
# Push services keep only the newest message per topic (RFC 8030 §5.4): a newer count replaces an older.
PUSH_TOPIC = "ai1net-waiting"


def waiting_payload(count: int) -> dict:
    """Everything a notification says. Nothing here may come from a question or a session."""
    return {"title": TITLE, "body": f"An agent is waiting ({count})", "url": PHONE_PATH, "count": count}


def _b64url_bytes(value: object, *, field: str, length: int) -> str:
    if not isinstance(value, str) or not value or len(value) > 256:
        raise ValidationFailed(f"{field} must be a base64url string.", code="bad_subscription")
    try:
        raw = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
    except (binascii.Error, ValueError):
        raise ValidationFailed(f"{field} must be a base64url string.", code="bad_subscription") from None
    if len(raw) != length or (field == "keys.p256dh" and raw[0] != 4):
        raise ValidationFailed(f"{field} has the wrong length for a Web Push key.", code="bad_subscription")
    return value.rstrip("=")


# --- subscriptions -----------------------------------------------------------------------------


def subscription_create(*, user: Any, endpoint: Any, p256dh: Any, auth: Any,
                        ip: str | None = None) -> tuple[PushSubscription, bool]:
    """Store a browser's push subscription for ``user``; returns it and whether it is new to this user.

    Resubscribing the same browser updates its keys. A browser can belong to one user only: an
    endpoint already held by another user (the phone changed hands) moves to this one; knowing the
    endpoint and its keys is proof of holding that browser.
    """
    endpoint = targets.check_url(endpoint, field="endpoint")
    targets.check_resolves_public(endpoint, field="endpoint")
    p256dh = _b64url_bytes(p256dh, field="keys.p256dh", length=65)
    auth = _b64url_bytes(auth, field="keys.auth", length=16)
    with transaction.atomic():
        subscription, created = PushSubscription.objects.select_for_update().get_or_create(
            endpoint=endpoint, defaults={"user": user, "p256dh": p256dh, "auth": auth})
        moved_from = None
        if not created:
            if subscription.user_id != user.pk:
                moved_from = subscription.user_id
            if moved_from or (subscription.p256dh, subscription.auth) != (p256dh, auth):
                PushSubscription.objects.filter(pk=subscription.pk).update(user=user, p256dh=p256dh, auth=auth,
                                                                           failures=0)
                subscription.user, subscription.p256dh, subscription.auth, subscription.failures = user, p256dh, auth, 0
        new_here = created or moved_from is not None
        if new_here:
            if PushSubscription.objects.filter(user=user).count() > MAX_SUBSCRIPTIONS_PER_USER:
                raise Conflict(f"At most {MAX_SUBSCRIPTIONS_PER_USER} browsers may be subscribed; unsubscribe one.",
                               code="too_many_subscriptions")
            data = {"subscription_id": subscription.pk, "service": subscription.service}
            if moved_from:
                data["moved_from_user_id"] = moved_from
            audit_record(actor=user, subject=user, action="notify.subscription.added", data=data, ip=ip)
    return subscription, new_here


def subscription_delete(*, user: Any, endpoint: Any = None, subscription_id: Any = None,
                        ip: str | None = None) -> None:
    """Forget one of ``user``'s subscriptions, by endpoint (the browser's own) or by id (a list)."""
    rows = PushSubscription.objects.filter(user=user)
    if subscription_id is not None:
        rows = rows.filter(pk=subscription_id)
    elif isinstance(endpoint, str) and endpoint:
        rows = rows.filter(endpoint=endpoint)
    else:
        raise ValidationFailed("Name the subscription by endpoint or id.", code="bad_subscription")
    with transaction.atomic():
        subscription = rows.select_for_update().first()
        if subscription is None:
            raise NotFound("No such subscription.")
        data = {"subscription_id": subscription.pk, "service": subscription.service}
        subscription.delete()
        audit_record(actor=user, subject=user, action="notify.subscription.removed", data=data, ip=ip)


# --- ntfy --------------------------------------------------------------------------------------


def ntfy_target_set(*, user: Any, url: Any, click_url: str, ip: str | None = None) -> NtfyTarget:
    url = targets.check_url(url, field="url")
    targets.check_resolves_public(url, field="url")
    if not urlsplit(url).path.strip("/"):
        raise ValidationFailed("url must name a topic: https://ntfy.example/<topic>.", code="bad_target")
    with transaction.atomic():
        target, created = NtfyTarget.objects.select_for_update().get_or_create(
            user=user, defaults={"url": url, "click_url": click_url})
        if not created:
            if (target.url, target.click_url) == (url, click_url):
                return target
            NtfyTarget.objects.filter(pk=target.pk).update(url=url, click_url=click_url, failures=0)
            target.url, target.click_url, target.failures = url, click_url, 0
        audit_record(actor=user, subject=user, action="notify.ntfy.set",
                     data={"host": urlsplit(url).hostname or ""}, ip=ip)
    return target


def ntfy_target_clear(*, user: Any, ip: str | None = None) -> bool:
    with transaction.atomic():
        target = NtfyTarget.objects.select_for_update().filter(user=user).first()
        if target is None:
            return False
        host = urlsplit(target.url).hostname or ""
        target.delete()
        audit_record(actor=user, subject=user, action="notify.ntfy.cleared", data={"host": host}, ip=ip)
    return True


# --- sending -----------------------------------------------------------------------------------


def _session() -> requests.Session:
    session = requests.Session()
    session.trust_env = False  # no proxies or .netrc from the environment
    session.max_redirects = 0  # a redirect is a failure, never followed
    return session


def webpush_send(subscription: PushSubscription, payload: bytes, keys: vapid.VapidKeys) -> int | None:
    """One encrypted push (RFC 8291 aes128gcm, VAPID-signed). Returns the push service's status, or None
    when no answer came (refused address, timeout, connection error, redirect)."""
    if not targets.send_allowed(subscription.endpoint):
        return None
    info = {"endpoint": subscription.endpoint, "keys": {"p256dh": subscription.p256dh, "auth": subscription.auth}}
    try:
        with _session() as session:
            response = webpush(info, data=payload.decode(), vapid_private_key=keys.vapid,
                               vapid_claims={"sub": settings.VAPID_SUBJECT}, ttl=settings.NOTIFY_TTL_SEC,
                               headers={"Urgency": "high", "Topic": PUSH_TOPIC},
                               timeout=settings.NOTIFY_TIMEOUT_SEC, requests_session=session)
        return response.status_code
    except WebPushException as exc:
        return exc.response.status_code if exc.response is not None else None
    except (requests.RequestException, OSError, ValueError) as exc:
        logger.info("web push to %s failed: %s", subscription.service, type(exc).__name__)
        return None


def ntfy_send(target: NtfyTarget, payload: dict) -> int | None:
    """POST the same generic text to the ntfy topic; Title and Click as headers. Returns the status."""
    if not targets.send_allowed(target.url):
        return None
    try:
        with httpx.Client(timeout=settings.NOTIFY_TIMEOUT_SEC, follow_redirects=False, trust_env=False) as client:
            response = client.post(target.url, content=payload["body"].encode(),
                                   headers={"Title": payload["title"], "Click": target.click_url,
                                            "Tags": "bell", "Content-Type": "text/plain; charset=utf-8"})
        return response.status_code
    except (httpx.HTTPError, OSError, ValueError) as exc:
        logger.info("ntfy to %s failed: %s", urlsplit(target.url).hostname, type(exc).__name__)
        return None


def _record(model: type, pk: int, ok: bool) -> None:
    if ok:
        model.objects.filter(pk=pk).update(last_ok=timezone.now(), failures=0)
    else:
        model.objects.filter(pk=pk).update(failures=F("failures") + 1)


def notify_user_waiting(*, user_id: Any) -> dict:
    """Tell ``user_id``'s phones and ntfy topic that questions wait, with their count only.

    404/410 from a push service deletes that subscription (the browser dropped it, audited); any other
    failure counts up ``failures``. Nothing is sent while nothing waits. Never raises for a target.
    """
    summary = {"count": 0, "sent": 0, "pruned": 0, "failed": 0}
    subscriptions = list(PushSubscription.objects.filter(user_id=user_id))
    target = NtfyTarget.objects.filter(user_id=user_id).first()
    if not subscriptions and target is None:
        return summary
    count = selectors.waiting_count(user_id=user_id)
    summary["count"] = count
    if count == 0:
        return summary
    payload = waiting_payload(count)
    keys = vapid.keys() if subscriptions else None
    body = json.dumps(payload, separators=(",", ":")).encode()
    for subscription in subscriptions if keys is not None else []:
        status = webpush_send(subscription, body, keys)
        if status in (404, 410):
            with transaction.atomic():
                if PushSubscription.objects.filter(pk=subscription.pk, endpoint=subscription.endpoint).delete()[0]:
                    audit_record(actor=None, subject=subscription.user, action="notify.subscription.pruned",
                                 data={"subscription_id": subscription.pk, "service": subscription.service,
                                       "status": status})
            summary["pruned"] += 1
            continue
        ok = status is not None and 200 <= status < 300
        _record(PushSubscription, subscription.pk, ok)
        summary["sent" if ok else "failed"] += 1
    if target is not None:
        status = ntfy_send(target, payload)
        ok = status is not None and 200 <= status < 300
        _record(NtfyTarget, target.pk, ok)
        summary["sent" if ok else "failed"] += 1
    return summary
