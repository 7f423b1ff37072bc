from __future__ import annotations

import hashlib
import secrets

from django.utils import timezone

from ai1net.accounts.models import ApiToken, User

API_TOKEN_PREFIX = "ai1_"


def hash_secret(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


def api_token_create(*, user: User, name: str) -> tuple[ApiToken, str]:
    raw = API_TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = ApiToken.objects.create(user=user, name=name, prefix=raw[:12], token_hash=hash_secret(raw))
    return token, raw


def api_token_authenticate(*, raw: str) -> ApiToken | None:
    token = (
        ApiToken.objects.select_related("user")
        .filter(token_hash=hash_secret(raw), revoked_at__isnull=True, user__is_active=True)
        .first()
    )
    if token is not None:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=timezone.now())
    return token


def api_token_revoke(*, user: User, token_id: int) -> None:
    ApiToken.objects.filter(user=user, pk=token_id, revoked_at__isnull=True).update(revoked_at=timezone.now())
