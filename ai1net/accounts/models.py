from __future__ import annotations

from typing import Any

from django.contrib.auth import models as auth_models
from django.contrib.auth.models import AbstractUser
from django.contrib.sessions.base_session import AbstractBaseSession
from django.core.exceptions import ValidationError
from django.db import connection, models
from django.utils import timezone
from django.utils.crypto import salted_hmac
from django_otp.models import Device

from ai1net import sql


class UserManager(auth_models.UserManager):
    """Django's, with ``get(pk=...)`` as one written statement: that is ``ModelBackend.get_user``, the
    session's user on every authenticated request, which the ORM built and compiled anew each time (294
    µs against 45 µs, warm, in one process); under ``ai1net.accounts.sessions.get_user`` not even that, when
    the session's read brought the row. Anything else goes through the ORM as before.

    The same statement answers ``user_needs_otp`` as the row is read (``User.needs_otp_at_load``): an
    HTTP request's check of its session's second factor then costs no round trip of its own."""

    def get(self, *args: Any, **kwargs: Any) -> Any:
        if args or kwargs.keys() != {"pk"} or self._db is not None or type(kwargs["pk"]) not in (int, str):
            return super().get(*args, **kwargs)
        model = self.model
        try:
            pk = model._meta.pk.to_python(kwargs["pk"])
        except ValidationError:
            return super().get(*args, **kwargs)  # the ORM's own error for it
        from ai1net.accounts.selectors import NEEDS_OTP_PARAMS_FOR_COLUMN, needs_otp_sql
        from ai1net.accounts.sessions import user_read_with_session

        user = user_read_with_session(pk)
        if user is not None:  # the session's user, read with its row a moment ago
            return user
        qn = connection.ops.quote_name
        user, needs_otp = sql.one_by_also(
            model, needs_otp_sql(connection.vendor, f"{qn(model._meta.db_table)}.{qn(model._meta.pk.column)}"),
            [*NEEDS_OTP_PARAMS_FOR_COLUMN], **{model._meta.pk.name: pk})
        if user is None:
            raise model.DoesNotExist(f"{model._meta.object_name} matching query does not exist.")
        user.needs_otp_at_load = bool(needs_otp)
        return user


class User(AbstractUser):
    """A person on the platform. Both feature switches start off; the user or an operator turns them on."""

    objects = UserManager()

    mobile_reply_enabled = models.BooleanField(default=False)
    device_web_enabled = models.BooleanField(default=False)
    # Bumped when two-factor is set up or removed: every other session of the user ends, as on a
    # password change (a session opened before enrolment must not outlive it unverified).
    otp_epoch = models.PositiveIntegerField(default=0, editable=False)
    # Whether the user needed a second factor when this object was read by ``User.objects.get(pk=...)``
    # (the session's user); None when read otherwise. Only a request's own check at its start may use it.
    needs_otp_at_load: bool | None = None

    def _get_session_auth_hash(self, secret: str | None = None) -> str:
        if not self.otp_epoch:
            return super()._get_session_auth_hash(secret=secret)
        key_salt = "ai1net.accounts.User.get_session_auth_hash"
        return salted_hmac(key_salt, f"{self.password}:{self.otp_epoch}", secret=secret,
                           algorithm="sha256").hexdigest()


class ApiToken(models.Model):
    """A per-user token for agents. Only the SHA-256 of the secret is stored; it is shown once."""

    user = models.ForeignKey(User, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=12, db_index=True)
    token_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"


class BackupCodeDevice(Device):
    """Single-use backup codes as a django-otp device. Unlike otp_static, only hashes are stored."""

    class Meta(Device.Meta):
        verbose_name = "backup code set"

    def verify_token(self, token: str) -> bool:
        from ai1net.accounts.services import backup_code_normalise, hash_secret

        code = backup_code_normalise(token)
        if not code:
            return False
        # The DELETE's row count decides: two concurrent uses of one code cannot both win.
        deleted, _ = BackupCode.objects.filter(device=self, code_hash=hash_secret(code)).delete()
        return bool(deleted)

    def remaining(self) -> int:
        return self.codes.count()


class BackupCode(models.Model):
    device = models.ForeignKey(BackupCodeDevice, on_delete=models.CASCADE, related_name="codes")
    code_hash = models.CharField(max_length=64)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["device", "code_hash"], name="backup_code_unique")]

    def __str__(self) -> str:
        return f"backup code #{self.pk}"


class FirstRunToken(models.Model):
    """The one-time link that creates the first operator on an empty database (hash stored only)."""

    token_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()
    used_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"first-run link {self.pk} (expires {self.expires_at:%Y-%m-%d %H:%M})"


class AuditEntryQuerySet(models.QuerySet):
    def update(self, **kwargs):  # noqa: ANN201 - append-only: bulk rewrites are refused too
        raise TypeError("audit entries are append-only")

    def delete(self):  # noqa: ANN201
        raise TypeError("audit entries are append-only")


class AuditEntry(models.Model):
    """Append-only audit log. Each row carries the hash of the previous one, so edits are detectable.

    The hash covers the snapshot labels (``actor_label``/``subject_label``), not the foreign keys,
    so deleting a user later (SET_NULL) does not break the chain.
    """

    GENESIS = "0" * 64

    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    actor = models.ForeignKey(User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    actor_label = models.CharField(max_length=200, blank=True)
    subject = models.ForeignKey(User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    subject_label = models.CharField(max_length=200, blank=True)
    action = models.CharField(max_length=64, db_index=True)
    data = models.JSONField(default=dict, blank=True)
    ip = models.CharField(max_length=64, blank=True)
    prev_hash = models.CharField(max_length=64)
    hash = models.CharField(max_length=64, unique=True)

    objects = AuditEntryQuerySet.as_manager()

    class Meta:
        ordering = ["-id"]
        verbose_name_plural = "audit entries"
        # One successor per entry: even a bug in the locking could not fork the chain silently.
        constraints = [models.UniqueConstraint(fields=["prev_hash"], name="audit_prev_hash_unique")]

    def __str__(self) -> str:
        return f"#{self.pk} {self.action} by {self.actor_label or 'system'}"

    def save(self, *args, **kwargs) -> None:
        if self.pk is not None and not kwargs.get("force_insert"):
            raise TypeError("audit entries are append-only")
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):  # noqa: ANN201
        raise TypeError("audit entries are append-only")


class AuditHead(models.Model):
    """The audit chain's newest hash, in one row (pk 1). Appending takes this row's lock with the
    UPDATE that reads it (``accounts.services.audit_record``), so appends queue on it until their
    transaction commits and each one links to the hash the previous one committed."""

    hash = models.CharField(max_length=64)
    # The hash before the last append's: on PostgreSQL one UPDATE moves the head and hands the entry its
    # prev_hash (``SET prev_hash = hash, hash = ...`` reads the old row), so lock and append are one statement.
    prev_hash = models.CharField(max_length=64, blank=True, default="")

    class Meta:
        verbose_name = "audit chain head"

    def __str__(self) -> str:
        return f"audit head {self.hash[:12]}"


class Session(AbstractBaseSession):
    """Django's database session, with the id of its user beside the data (``ai1net.accounts.sessions``):
    the request's one read then brings the user's row too. ``user`` follows the data's user id on every
    save; no database constraint, so a user deleted meanwhile never fails a session's save (deleting a user
    through the ORM still deletes their sessions: everywhere logged out)."""

    user = models.ForeignKey(User, null=True, blank=True, on_delete=models.CASCADE, db_constraint=False,
                             related_name="+")

    @classmethod
    def get_session_store_class(cls) -> type:
        from ai1net.accounts.sessions import SessionStore

        return SessionStore
