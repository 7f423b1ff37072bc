"""``{% mobile_status user as state %}``: the figures of GET /api/mobile/state, for the home page card."""

from __future__ import annotations

from typing import Any

from django import template
from django.utils.dateparse import parse_datetime

from mobile import selectors

register = template.Library()


@register.simple_tag
def mobile_status(user: Any) -> dict:
    if not getattr(user, "is_authenticated", False):
        return {}
    state = selectors.mobile_state(user=user)
    for bridge in state["bridges"]:
        bridge["last_seen"] = parse_datetime(bridge["last_seen_at"]) if bridge["last_seen_at"] else None
    return state
