from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models

from devices.models import Device

# Ops the probe answers at once (no approval): they only read.
READ_OPS = frozenset(
    {"read", "read_tree", "grep", "stat", "git_diff", "git_log", "ast_parse", "ping", "info", "run_output"}
)
# Ops that change the machine: each one waits for the owner's approval of its exact arguments.
APPROVAL_OPS = frozenset({"write", "run", "run_background", "stop"})
ALL_OPS = READ_OPS | APPROVAL_OPS
# Which mode the probe must have been started with (`--write` / `--exec`) for an op.
OP_MODE = {"write": "write", "run": "exec", "run_background": "exec", "stop": "exec"}


class ProbeCommand(models.Model):
    """One command to a probe, from request to result. The record is the authorization gateway's ledger."""

    class State(models.TextChoices):
        AWAITING_APPROVAL = "awaiting_approval"
        APPROVED = "approved"
        REJECTED = "rejected"
        SENT = "sent"
        DONE = "done"
        FAILED = "failed"
        EXPIRED = "expired"

    class Via(models.TextChoices):
        API = "api"
        STUDIO = "studio"

    FINAL_STATES = frozenset({State.REJECTED, State.DONE, State.FAILED, State.EXPIRED})

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="probe_commands")
    device = models.ForeignKey(Device, on_delete=models.CASCADE, related_name="probe_commands")
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="probe_commands_requested"
    )
    via = models.CharField(max_length=10, choices=Via.choices, default=Via.API)
    op = models.CharField(max_length=32)
    args = models.JSONField(default=dict, blank=True)
    args_hash = models.CharField(max_length=64, help_text="sha256 of the canonical JSON of {op, args}.")
    state = models.CharField(max_length=20, choices=State.choices, default=State.AWAITING_APPROVAL)
    result = models.JSONField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True, help_text='{"code", "detail"}')
    preview = models.TextField(blank=True, help_text="For writes: the unified diff shown before approval.")
    approval_hash = models.CharField(max_length=64, blank=True, help_text="The args_hash that was approved.")
    approved_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    approved_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True, help_text="An approval not given by then expires.")
    created_at = models.DateTimeField(auto_now_add=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["owner", "state"]),
            models.Index(fields=["device", "-created_at"]),
            # A probe's commands in flight, counted for every new command (its cap): not all it ever ran.
            models.Index(fields=["device", "state"]),
        ]

    def __str__(self) -> str:
        return f"{self.op} on {self.device_id} ({self.state})"

    @property
    def is_final(self) -> bool:
        return self.state in self.FINAL_STATES

    @property
    def needs_approval(self) -> bool:
        return self.op in APPROVAL_OPS
