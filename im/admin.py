from django.contrib import admin

from im.models import Message, Panel, PanelAction, Room, RoomMember


class MemberInline(admin.TabularInline):
    model = RoomMember
    extra = 0
    raw_id_fields = ["user"]


@admin.register(Room)
class RoomAdmin(admin.ModelAdmin):
    list_display = ["id", "kind", "title", "owner", "device", "state", "created_at"]
    list_filter = ["kind", "state"]
    search_fields = ["title", "agent_session_id", "owner__username"]
    raw_id_fields = ["owner", "device"]
    inlines = [MemberInline]


@admin.register(Message)
class MessageAdmin(admin.ModelAdmin):
    list_display = ["room", "seq", "kind", "author_user", "author_device", "created_at"]
    list_filter = ["kind"]
    raw_id_fields = ["room", "author_user", "author_device"]


@admin.register(Panel)
class PanelAdmin(admin.ModelAdmin):
    list_display = ["id", "room", "kind", "state", "ref_id", "updated_at"]
    list_filter = ["kind", "state"]
    raw_id_fields = ["room", "message"]


@admin.register(PanelAction)
class PanelActionAdmin(admin.ModelAdmin):
    list_display = ["panel", "actor", "action", "created_at"]
    raw_id_fields = ["panel", "actor"]
