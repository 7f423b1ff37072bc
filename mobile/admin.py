from django.contrib import admin

from mobile.models import AgentSession, Answer, PhoneMessage, Question


@admin.register(AgentSession)
class AgentSessionAdmin(admin.ModelAdmin):
    list_display = ["session_id", "device", "title", "state", "keep_going", "created_at"]
    list_filter = ["state"]
    raw_id_fields = ["device", "room"]


@admin.register(Question)
class QuestionAdmin(admin.ModelAdmin):
    list_display = ["id", "device", "session", "state", "expires_at", "created_at"]
    list_filter = ["state"]
    raw_id_fields = ["device", "session", "room", "panel"]
    exclude = ["nonce_hash", "nonce_salt"]


@admin.register(Answer)
class AnswerAdmin(admin.ModelAdmin):
    list_display = ["question", "via", "actor", "created_at"]
    raw_id_fields = ["question", "actor"]


@admin.register(PhoneMessage)
class PhoneMessageAdmin(admin.ModelAdmin):
    list_display = ["id", "session", "author", "state", "created_at"]
    list_filter = ["state"]
    raw_id_fields = ["session", "author"]
