"""Read-only: subscriptions change through the phone page and its API (audited), never here."""

from __future__ import annotations

from typing import Any

from django.contrib import admin

from notify.models import NtfyTarget, PushSubscription


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request: Any) -> bool:
        return False

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        return False


@admin.register(PushSubscription)
class PushSubscriptionAdmin(ReadOnlyAdmin):
    list_display = ("user", "service", "created", "last_ok", "failures")
    list_select_related = ("user",)
    search_fields = ("user__username",)
    exclude = ("endpoint", "p256dh", "auth")  # capabilities: whoever holds them can push to that phone


@admin.register(NtfyTarget)
class NtfyTargetAdmin(ReadOnlyAdmin):
    list_display = ("user", "__str__", "created", "last_ok", "failures")
    list_select_related = ("user",)
    search_fields = ("user__username",)
    exclude = ("url",)
