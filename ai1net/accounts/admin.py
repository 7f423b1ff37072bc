from __future__ import annotations

from django.contrib import admin, messages
from django.contrib.auth.admin import UserAdmin as DjangoUserAdmin
from django.db.models import QuerySet
from django.http import HttpRequest

from ai1net.accounts import services
from ai1net.accounts.models import ApiToken, AuditEntry, User
from ai1net.accounts.views import client_ip


def _bulk_switch(switch: services.Switch, enabled: bool, label: str):  # noqa: ANN202
    def action(modeladmin: UserAdmin, request: HttpRequest, queryset: QuerySet[User]) -> None:
        changed = sum(
            services.user_switch_set(actor=request.user, user=user, switch=switch, enabled=enabled,
                                     ip=client_ip(request))
            for user in queryset
        )
        modeladmin.message_user(request, f"{label}: {changed} user(s) changed.", messages.SUCCESS)

    action.__name__ = f"{switch}_{'on' if enabled else 'off'}"
    action.short_description = label
    return action


@admin.register(User)
class UserAdmin(DjangoUserAdmin):
    list_display = ("username", "email", "is_staff", "is_active", "mobile_reply_enabled", "device_web_enabled")
    list_filter = ("mobile_reply_enabled", "device_web_enabled", "is_staff", "is_superuser", "is_active")
    fieldsets = (*DjangoUserAdmin.fieldsets, ("Switches", {"fields": ("mobile_reply_enabled", "device_web_enabled")}))
    actions = (
        _bulk_switch("mobile_reply", True, "Turn mobile reply on"),
        _bulk_switch("mobile_reply", False, "Turn mobile reply off"),
        _bulk_switch("device_web", True, "Turn device web on"),
        _bulk_switch("device_web", False, "Turn device web off"),
    )

    def save_model(self, request: HttpRequest, obj: User, form, change: bool) -> None:  # noqa: ANN001
        # Switch changes go through the service so they are audited and announced.
        wanted = {name: getattr(obj, field) for name, field in services.SWITCHES.items()}
        if change:
            current = User.objects.get(pk=obj.pk)
            for field in services.SWITCHES.values():
                setattr(obj, field, getattr(current, field))
        else:
            for field in services.SWITCHES.values():
                setattr(obj, field, False)
        super().save_model(request, obj, form, change)
        for switch, enabled in wanted.items():
            services.user_switch_set(actor=request.user, user=obj, switch=switch, enabled=enabled,
                                     ip=client_ip(request))


@admin.register(AuditEntry)
class AuditEntryAdmin(admin.ModelAdmin):
    """Read-only: the log is append-only; nobody adds, edits or deletes here."""

    list_display = ("id", "created_at", "action", "actor_label", "subject_label", "ip")
    list_filter = ("action",)
    search_fields = ("action", "actor_label", "subject_label")
    readonly_fields = ("created_at", "action", "actor_label", "subject_label", "data", "ip", "prev_hash", "hash")
    exclude = ("actor", "subject")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: AuditEntry | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: AuditEntry | None = None) -> bool:
        return False


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ("name", "user", "prefix", "created_at", "last_used_at", "revoked_at")
    readonly_fields = ("user", "name", "prefix", "token_hash", "created_at", "last_used_at", "revoked_at")
    list_filter = ("revoked_at",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False
