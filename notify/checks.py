"""`check --deploy`: say clearly when Web Push is half configured. No VAPID keys at all: the feature is
off, which is a choice, not a mistake (ntfy works without keys)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks
from django.core.checks import Tags, register

from notify import vapid


@register(Tags.security, deploy=True)
def vapid_keys_check(app_configs: Any = None, **kwargs: Any) -> list[checks.Warning]:
    private, public = settings.VAPID_PRIVATE_KEY, settings.VAPID_PUBLIC_KEY
    if not private and not public:
        return []
    if not private:
        return [checks.Warning("AI1NET_VAPID_PUBLIC_KEY is set without AI1NET_VAPID_PRIVATE_KEY: Web Push is off.",
                        hint="Set both (or neither).", id="notify.W001")]
    try:
        vapid.from_environment(private, public)
    except vapid.VapidKeyError as exc:
        return [checks.Warning(f"{exc} Web Push is off.", hint="Generate a pair, e.g. with `vapid --gen` (py-vapid).",
                        id="notify.W002")]
    if not settings.VAPID_SUBJECT.startswith(("mailto:", "https://")) or settings.VAPID_SUBJECT.endswith("@localhost"):
        return [checks.Warning("AI1NET_VAPID_SUBJECT should be a mailto: address or an https:// URL push services can "
                        "reach you at; some refuse pushes otherwise.", id="notify.W003")]
    return []
