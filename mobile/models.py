"""Mobile reply: agent sessions, questions with one-time nonces, answers, phone -> session messages."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models


class AgentSession(models.Model):
    """An agent session on one of the user's desktops (Claude Code's ``session_id``), mirrored by a room."""

    class State(models.TextChoices):
        OPEN = "open", "Open"
        ENDED = "ended", "Ended"

    device = models.ForeignKey("devices.Device", on_delete=models.CASCADE, related_name="agent_sessions")
    session_id = models.CharField(max_length=200)
    room = models.ForeignKey("im.Room", on_delete=models.CASCADE, related_name="+")
    cwd = models.CharField(max_length=1000, blank=True)
    host = models.CharField(max_length=255, blank=True)
    source = models.CharField(max_length=32, blank=True)
    title = models.CharField(max_length=200, blank=True)
    keep_going = models.BooleanField(default=False)
    state = models.CharField(max_length=10, choices=State.choices, default=State.OPEN)
    end_reason = models.CharField(max_length=64, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [models.UniqueConstraint(fields=["device", "session_id"], name="mobile_session_unique")]

    def __str__(self) -> str:
        return f"session {self.session_id} on {self.device_id}"


class BridgeSwitchSent(models.Model):
    """The mobile-reply switch value last queued for a bridge: a reconnect compares the user's switch with
    this row instead of searching the bridge's outbox, which grows with every answer."""

    device = models.OneToOneField("devices.Device", on_delete=models.CASCADE, primary_key=True, related_name="+")
    enabled = models.BooleanField()

    def __str__(self) -> str:
        return f"switch {'on' if self.enabled else 'off'} sent to {self.device_id}"


class Question(models.Model):
    """One AskUserQuestion call, or one tool-permission request (``kind``). Its id is chosen by the
    device, so a retried request is idempotent.

    The nonce the phone must present is never stored: only its SHA-256 (``nonce_hash``) and the random
    ``nonce_salt`` it is derived from with the server key (see ``mobile.services.nonce_for``).
    """

    class State(models.TextChoices):
        PENDING = "pending", "Waiting for an answer"
        ANSWERED = "answered", "Answered on the phone"
        ANSWERED_ON_DESKTOP = "answered_on_desktop", "Answered on the desktop"
        MOVED_TO_DESKTOP = "moved_to_desktop", "Moved to the desktop"
        EXPIRED = "expired", "Expired"
        CANCELLED = "cancelled", "Cancelled"

    class Kind(models.TextChoices):
        QUESTION = "question", "AskUserQuestion"
        PERMISSION = "permission", "Tool permission"  # clients.permission: one question, three fixed options

    id = models.UUIDField(primary_key=True, editable=False)
    kind = models.CharField(max_length=10, choices=Kind.choices, default=Kind.QUESTION)
    tool_name = models.CharField(max_length=200, blank=True, help_text="permission: the tool asking to run")
    input_hash = models.CharField(max_length=64, blank=True,
                                  help_text="permission: SHA-256 of the tool input the decision is bound to")
    rendering = models.JSONField(default=dict, blank=True,
                                 help_text="permission: {kind, text, truncated} shown on the phone")
    device = models.ForeignKey("devices.Device", on_delete=models.CASCADE, related_name="questions")
    session = models.ForeignKey(AgentSession, on_delete=models.CASCADE, related_name="questions")
    room = models.ForeignKey("im.Room", on_delete=models.CASCADE, related_name="+")
    panel = models.ForeignKey("im.Panel", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    tool_use_id = models.CharField(max_length=200, blank=True)
    questions = models.JSONField()
    nonce_salt = models.CharField(max_length=64)
    nonce_hash = models.CharField(max_length=64)
    state = models.CharField(max_length=24, choices=State.choices, default=State.PENDING)
    state_reason = models.CharField(max_length=32, blank=True)
    window_sec = models.PositiveIntegerField()
    expires_at = models.DateTimeField()
    created_at = models.DateTimeField(auto_now_add=True)
    decided_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at"]
        indexes = [models.Index(fields=["device", "state"]), models.Index(fields=["session", "tool_use_id"])]

    def __str__(self) -> str:
        return f"question {self.pk} ({self.state})"


class Answer(models.Model):
    """The one answer a question gets (first wins); ``actor`` is null when it was given at the desk."""

    class Via(models.TextChoices):
        PHONE = "phone", "Phone"
        DESKTOP = "desktop", "Desktop"

    question = models.OneToOneField(Question, on_delete=models.CASCADE, related_name="answer")
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                              related_name="+")
    via = models.CharField(max_length=10, choices=Via.choices)
    answers = models.JSONField(default=dict, help_text="question text -> [chosen labels]")
    other = models.JSONField(default=dict, help_text="question text -> free text")
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"answer to {self.question_id} via {self.via}"


class PhoneMessage(models.Model):
    """Free text from the phone to an agent session, queued on the device until a hook injects it."""

    class State(models.TextChoices):
        WAITING = "waiting", "Waiting (paced)"  # held on the platform by mobile.pacing, in order
        QUEUED = "queued", "Queued"  # released: in the device's outbox
        DELIVERED = "delivered", "Delivered"
        CONSUMED = "consumed", "Consumed"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    session = models.ForeignKey(AgentSession, on_delete=models.CASCADE, related_name="phone_messages")
    author = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    text = models.TextField()
    state = models.CharField(max_length=10, choices=State.choices, default=State.QUEUED)
    created_at = models.DateTimeField(auto_now_add=True)
    released_at = models.DateTimeField(null=True, blank=True, help_text="Put into the device's outbox.")
    consumed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at"]
        indexes = [models.Index(fields=["session", "state", "created_at"])]

    def __str__(self) -> str:
        return f"message {self.pk} ({self.state})"
