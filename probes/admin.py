from django.contrib import admin

from probes.models import ProbeCommand


@admin.register(ProbeCommand)
class ProbeCommandAdmin(admin.ModelAdmin):
    list_display = ("op", "device", "owner", "state", "via", "created_at", "finished_at")
    list_filter = ("state", "op", "via")
    search_fields = ("id", "device__name", "owner__username")
    # The ledger is written by the gateway only; an edited row would void its approval anyway.
    readonly_fields = [f.name for f in ProbeCommand._meta.fields]

    def has_add_permission(self, request):
        return False
