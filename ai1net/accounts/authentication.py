from __future__ import annotations

from typing import Any

from rest_framework import authentication, exceptions

from ai1net.accounts import ratelimit, selectors, services


class ApiTokenAuthentication(authentication.BaseAuthentication):
    """`Authorization: Bearer <api token>` for agents; session auth stays for browsers (with CSRF)."""

    keyword = "Bearer"

    def authenticate(self, request: Any) -> tuple[Any, Any] | None:
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        scheme, _, raw = header.partition(" ")
        if scheme != self.keyword or not raw.strip():
            return None
        # Checked before the lookup: while the address is limited even a right guess is refused.
        address = (ratelimit.API_TOKEN_PER_ADDRESS, request.META.get("REMOTE_ADDR", ""))
        ratelimit.check(address, what="Too many invalid API tokens from this address.")
        token = services.api_token_authenticate(raw=raw.strip())
        if token is None:
            if not selectors.api_token_issued(raw=raw.strip()):
                ratelimit.fail(address, ip=address[1])
            raise exceptions.AuthenticationFailed("Invalid or revoked API token.")
        return token.user, token

    def authenticate_header(self, request: Any) -> str:
        return self.keyword
