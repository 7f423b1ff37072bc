"""Rooms, members, messages and interactive panels.

A room belongs to an owner and, for agent sessions, to the device and the agent session it mirrors.
Messages carry a per-room monotonic ``seq`` (allocated in the database, see ``services.message_post``)
so clients page by cursor and never miss or repeat one.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q


class Room(models.Model):
    class Kind(models.TextChoices):
        AGENT_SESSION = "agent_session", "Agent session"
        STUDIO = "studio", "Studio"
        DIRECT = "direct", "Direct"

    class State(models.TextChoices):
        OPEN = "open", "Open"
        CLOSED = "closed", "Closed"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    kind = models.CharField(max_length=20, choices=Kind.choices)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="rooms_owned")
    device = models.ForeignKey("devices.Device", null=True, blank=True, on_delete=models.SET_NULL,
                               related_name="rooms")
    agent_session_id = models.CharField(max_length=200, blank=True)
    title = models.CharField(max_length=200, blank=True)
    state = models.CharField(max_length=10, choices=State.choices, default=State.OPEN)
    next_seq = models.PositiveBigIntegerField(default=1)
    created_at = models.DateTimeField(auto_now_add=True)
    closed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["device", "agent_session_id"], condition=Q(kind="agent_session"),
                                    name="im_room_unique_agent_session"),
            models.UniqueConstraint(fields=["owner", "device"], condition=Q(kind="studio"),
                                    name="im_room_unique_studio"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.title or self.pk}"

    @property
    def is_open(self) -> bool:
        return self.state == self.State.OPEN


class RoomMember(models.Model):
    room = models.ForeignKey(Room, on_delete=models.CASCADE, related_name="members")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="room_memberships")
    joined_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["room", "user"], name="im_member_unique")]

    def __str__(self) -> str:
        return f"{self.user_id} in {self.room_id}"


class Message(models.Model):
    class Kind(models.TextChoices):
        TEXT = "text", "Text"
        QUESTION = "question", "Question"
        ANSWER = "answer", "Answer"
        EVENT = "event", "Event"

    room = models.ForeignKey(Room, on_delete=models.CASCADE, related_name="messages")
    seq = models.PositiveBigIntegerField()
    author_user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                    related_name="+")
    author_device = models.ForeignKey("devices.Device", null=True, blank=True, on_delete=models.SET_NULL,
                                      related_name="+")
    kind = models.CharField(max_length=10, choices=Kind.choices)
    body = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["room", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["room", "seq"], name="im_message_unique_room_seq"),
            # A message has at most one author; system events have none.
            models.CheckConstraint(condition=Q(author_user__isnull=True) | Q(author_device__isnull=True),
                                   name="im_message_one_author"),
        ]

    def __str__(self) -> str:
        return f"{self.room_id}#{self.seq} {self.kind}"


class Panel(models.Model):
    """An interactive card in a room (e.g. a mobile question); its kind picks the handler in im.panels."""

    room = models.ForeignKey(Room, on_delete=models.CASCADE, related_name="panels")
    message = models.ForeignKey(Message, null=True, blank=True, on_delete=models.SET_NULL, related_name="panels")
    kind = models.CharField(max_length=64)
    spec = models.JSONField(default=dict)
    state = models.CharField(max_length=32, default="open")
    ref_id = models.CharField(max_length=64, blank=True, db_index=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["room", "id"]

    def __str__(self) -> str:
        return f"panel {self.pk} {self.kind} ({self.state})"


class PanelAction(models.Model):
    panel = models.ForeignKey(Panel, on_delete=models.CASCADE, related_name="actions")
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    action = models.CharField(max_length=32)
    data = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["panel", "id"]

    def __str__(self) -> str:
        return f"{self.action} on panel {self.panel_id}"
