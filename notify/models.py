"""Where a user's "an agent is waiting" notices go: Web Push subscriptions and one ntfy topic."""

from __future__ import annotations

from urllib.parse import urlsplit

from django.conf import settings
from django.db import models


class PushSubscription(models.Model):
    """One browser's Web Push subscription (PushSubscription.toJSON() from the phone page).

    The endpoint is a capability URL at the browser's push service; whoever holds it and the keys can
    push to that browser. A push answered 404/410 deletes the row (the browser dropped it).
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="push_subscriptions")
    endpoint = models.CharField(max_length=1024, unique=True)
    p256dh = models.CharField(max_length=128, help_text="the browser's P-256 public key, base64url")
    auth = models.CharField(max_length=64, help_text="the browser's auth secret, base64url")
    created = models.DateTimeField(auto_now_add=True)
    last_ok = models.DateTimeField(null=True, blank=True)
    failures = models.PositiveIntegerField(default=0, help_text="failed pushes since the last success")

    class Meta:
        ordering = ["created", "id"]

    def __str__(self) -> str:
        return f"push to {self.service} for #{self.user_id}"

    @property
    def service(self) -> str:
        """The push service's host: what may be shown and logged (the endpoint itself is a secret)."""
        return urlsplit(self.endpoint).hostname or ""


class NtfyTarget(models.Model):
    """A user's ntfy topic URL: the same generic notice, POSTed as text."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="ntfy_target")
    url = models.CharField(max_length=512)
    click_url = models.CharField(max_length=512, help_text="absolute address of /m/ (the Click header)")
    created = models.DateTimeField(auto_now_add=True)
    last_ok = models.DateTimeField(null=True, blank=True)
    failures = models.PositiveIntegerField(default=0)

    def __str__(self) -> str:
        return f"ntfy at {urlsplit(self.url).hostname} for #{self.user_id}"
