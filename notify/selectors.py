"""Reads for notifications: what a user has subscribed, and how many questions wait."""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from mobile.models import Question
from notify.models import NtfyTarget, PushSubscription


def waiting_count(*, user_id: Any) -> int:
    return Question.objects.filter(device__owner_id=user_id, state=Question.State.PENDING,
                                   expires_at__gt=timezone.now()).count()


def subscription_data(subscription: PushSubscription) -> dict:
    return {
        "id": subscription.pk,
        "endpoint": subscription.endpoint,
        "service": subscription.service,
        "created": subscription.created.isoformat(),
        "last_ok": subscription.last_ok.isoformat() if subscription.last_ok else None,
        "failures": subscription.failures,
    }


def subscriptions(*, user: Any) -> list[dict]:
    return [subscription_data(s) for s in PushSubscription.objects.filter(user=user)]


def ntfy_data(target: NtfyTarget | None) -> dict:
    if target is None:
        return {"url": None, "click_url": None, "last_ok": None, "failures": 0}
    return {"url": target.url, "click_url": target.click_url,
            "last_ok": target.last_ok.isoformat() if target.last_ok else None, "failures": target.failures}


def ntfy_target(*, user: Any) -> dict:
    return ntfy_data(NtfyTarget.objects.filter(user=user).first())


def has_targets(*, user_id: Any) -> bool:
    return (PushSubscription.objects.filter(user_id=user_id).exists()
            or NtfyTarget.objects.filter(user_id=user_id).exists())
