from django.contrib import admin, messages

from devices import services
from devices.models import Device, OutboxItem, PairingRequest


@admin.register(Device)
class DeviceAdmin(admin.ModelAdmin):
    list_display = ["name", "owner", "kind", "status", "online", "last_seen_at", "connection_count", "created_at"]
    list_filter = ["kind", "status", "ephemeral"]
    search_fields = ["name", "hostname", "owner__username"]
    readonly_fields = [f.name for f in Device._meta.fields]
    actions = ["revoke"]

    @admin.display(boolean=True)
    def online(self, obj: Device) -> bool:
        return obj.is_online

    def has_add_permission(self, request) -> bool:
        return False

    @admin.action(description="Revoke the selected devices (closes live tunnels with 4403)")
    def revoke(self, request, queryset) -> None:
        count = sum(services.device_revoke(device=d, actor=request.user, ip=request.META.get("REMOTE_ADDR"),
                                           reason="revoked by an operator") for d in queryset)
        self.message_user(request, f"Revoked {count} device(s).", messages.SUCCESS)


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(PairingRequest)
class PairingRequestAdmin(ReadOnlyAdmin):
    list_display = ["name", "kind", "state", "user", "hostname", "requested_from", "created_at", "expires_at"]
    list_filter = ["state", "kind"]
    exclude = ["device_code_hash", "user_code_hash"]


@admin.register(OutboxItem)
class OutboxItemAdmin(ReadOnlyAdmin):
    list_display = ["device", "seq", "kind", "created_at", "acked_at"]
    list_filter = ["kind"]
    list_select_related = ["device"]
