from __future__ import annotations

import uuid
from datetime import timedelta

from django.conf import settings
from django.db import models
from django.db.models.base import ModelState
from django.utils import timezone

# Device.channel_name of a device in HTTP long-poll mode (devices.longpoll): no channel to reach it;
# it is online while its polls keep coming (last_seen_at within HEARTBEAT_MISSES heartbeats).
LONGPOLL_PREFIX = "longpoll."
LONGPOLL_MISSES = 3


def is_tunnel_channel(channel_name: str) -> bool:
    """A live WebSocket tunnel's channel: not empty, not a long poll's marker (no channel reaches a poll)."""
    return bool(channel_name) and not channel_name.startswith(LONGPOLL_PREFIX)


class Device(models.Model):
    """A paired machine of a user's: a desktop bridge or a probe. Only a hash of its token is kept."""

    class Kind(models.TextChoices):
        BRIDGE = "bridge", "Bridge (desktop)"
        PROBE = "probe", "Probe"

    class Status(models.TextChoices):
        ACTIVE = "active", "Active"
        REVOKED = "revoked", "Revoked"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="devices")
    name = models.CharField(max_length=100)
    kind = models.CharField(max_length=10, choices=Kind.choices)
    hostname = models.CharField(max_length=255, blank=True)
    os = models.CharField(max_length=100, blank=True)
    client_version = models.CharField(max_length=50, blank=True)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.ACTIVE)
    token_hash = models.CharField(max_length=64, unique=True)
    ephemeral = models.BooleanField(default=False, help_text="Paired for one run (probes): the token dies with it.")
    created_at = models.DateTimeField(auto_now_add=True)
    last_seen_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    # Presence, written by the tunnel consumer.
    connection_count = models.PositiveIntegerField(default=0)
    channel_name = models.CharField(max_length=200, blank=True, help_text="The live connection's channel.")
    # host:port of the device-web stream relay of the daphne process that holds the live connection
    # (devices.web.relay; scaled out only): written with channel_name by the hello, empty when none.
    relay = models.CharField(max_length=300, blank=True, help_text="Stream relay of the live connection's process.")
    connected_at = models.DateTimeField(null=True, blank=True)
    disconnected_at = models.DateTimeField(null=True, blank=True)

    # What the device said in its last hello.
    capabilities = models.JSONField(default=list, blank=True)
    ports = models.JSONField(default=list, blank=True)
    roots = models.JSONField(default=list, blank=True)
    protocol_version = models.PositiveIntegerField(default=0)

    # Durable outbox bookkeeping: the next seq to allocate and the highest seq the device acked.
    next_seq = models.PositiveBigIntegerField(default=1)
    acked_seq = models.PositiveBigIntegerField(default=0)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["owner", "kind", "status"])]

    def __str__(self) -> str:
        return f"{self.name} ({self.kind})"

    @property
    def is_online(self) -> bool:
        if self.status != self.Status.ACTIVE or not self.channel_name:
            return False
        if self.channel_name.startswith(LONGPOLL_PREFIX):
            window = timedelta(seconds=settings.DEVICE_HEARTBEAT_SEC * LONGPOLL_MISSES)
            return self.last_seen_at is not None and timezone.now() - self.last_seen_at < window
        return True

    @property
    def is_long_polling(self) -> bool:
        return self.channel_name.startswith(LONGPOLL_PREFIX)

    def copied(self) -> Device:
        """What ``copy.copy`` gives (the same field values, a cache of related objects of its own), without its
        detour through pickling's hooks: 3 µs where that took 18 (a tunnel's connect and close copy it three
        times, on the database thread every socket of the process waits on for the GIL)."""
        clone = Device.__new__(Device)
        clone.__dict__.update(self.__dict__)
        clone._state = ModelState()
        clone._state.__dict__.update(self._state.__dict__)
        clone._state.fields_cache = dict(self._state.fields_cache)
        return clone


class OutboxItem(models.Model):
    """Platform -> device work, written before it is sent; resent after `ackedSeq` on reconnect."""

    device = models.ForeignKey(Device, on_delete=models.CASCADE, related_name="outbox")
    seq = models.PositiveBigIntegerField()
    kind = models.CharField(max_length=64)
    payload = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)
    acked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["device", "seq"]
        constraints = [models.UniqueConstraint(fields=["device", "seq"], name="outbox_unique_device_seq")]

    def __str__(self) -> str:
        return f"{self.device_id}#{self.seq} {self.kind}"


class DeviceRequest(models.Model):
    """A device -> platform request by its client-generated id, so a retry gets the first answer."""

    device = models.ForeignKey(Device, on_delete=models.CASCADE, related_name="requests")
    request_id = models.CharField(max_length=64)
    method = models.CharField(max_length=64)
    response = models.JSONField(help_text='{"result": ...} or {"error": {...}}')
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["device", "request_id"], name="device_request_unique_id")]

    def __str__(self) -> str:
        return f"{self.device_id} {self.method} {self.request_id}"


class PairingRequest(models.Model):
    """The QR pairing ceremony (RFC 8628 device authorization grant). Codes are stored hashed."""

    class State(models.TextChoices):
        PENDING = "pending"
        SCANNED = "scanned"
        APPROVED = "approved"
        DENIED = "denied"
        CLAIMED = "claimed"
        EXPIRED = "expired"

    device_code_hash = models.CharField(max_length=64, unique=True)
    user_code_hash = models.CharField(max_length=64, unique=True)
    name = models.CharField(max_length=100)
    kind = models.CharField(max_length=10, choices=Device.Kind.choices)
    hostname = models.CharField(max_length=255, blank=True)
    os = models.CharField(max_length=100, blank=True)
    client_version = models.CharField(max_length=50, blank=True)
    ephemeral = models.BooleanField(default=False)
    state = models.CharField(max_length=10, choices=State.choices, default=State.PENDING)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE)
    device = models.OneToOneField(Device, null=True, blank=True, on_delete=models.SET_NULL)
    requested_from = models.GenericIPAddressField(null=True, blank=True)
    interval = models.PositiveIntegerField(default=5)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    last_polled_at = models.DateTimeField(null=True, blank=True)
    decided_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"pairing {self.pk} {self.name} ({self.state})"
