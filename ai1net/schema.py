"""OpenAPI glue for /api/schema/: the shared error body, the bearer schemes, the long-poll paths.

Every API renders failures as ``{"error": code, "detail": message}`` (``ai1net.exceptions``); views
declare theirs with ``errors(400, 404, ...)``. Agents authenticate with a per-user API token, devices
with the token they got from pairing; both travel as ``Authorization: Bearer``.
"""

from __future__ import annotations

from typing import Any

from django.urls import reverse
from drf_spectacular.authentication import SessionScheme
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.utils import OpenApiResponse
from rest_framework import serializers

DEVICE_TOKEN = "deviceToken"  # its security scheme is in SPECTACULAR_SETTINGS["APPEND_COMPONENTS"]

_ERROR_TEXT = {
    400: "Invalid input (`invalid`, with `fields` for serializer errors) or a refusal named by `error`.",
    401: "Missing or unknown token.",
    403: "Not allowed: not logged in, two-factor not verified (`otp_required`), or a refusal named by `error`.",
    404: "Not found, or not yours.",
    409: "The object is not in a state that allows this.",
    410: "No longer available (expired or ended).",
    413: "The body is too large.",
    429: "Too many requests; wait and try again.",
    503: "The service is not available right now.",
}


class ErrorSerializer(serializers.Serializer):
    error = serializers.CharField(help_text="machine-readable code, e.g. `invalid`, `not_found`, `expired`")
    detail = serializers.CharField(help_text="a sentence for people")
    fields = serializers.DictField(required=False, help_text="per-field messages when `error` is `invalid`")


def errors(*statuses: int) -> dict[int, OpenApiResponse]:
    """``responses={200: Out, **errors(400, 404)}``: the shared error body under each status."""
    return {status: OpenApiResponse(ErrorSerializer, description=_ERROR_TEXT[status]) for status in statuses}


class ApiTokenScheme(OpenApiAuthenticationExtension):
    target_class = "ai1net.accounts.authentication.ApiTokenAuthentication"
    name = "apiToken"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {"type": "http", "scheme": "bearer",
                "description": "A per-user API token (Account -> API tokens), for agents."}


class SessionUserScheme(SessionScheme):
    """Our session authentication (ai1net.accounts.authentication) is DRF's: the same cookie scheme."""

    target_class = "ai1net.accounts.authentication.SessionAuthentication"


def add_longpoll_endpoints(endpoints: list[tuple]) -> list[tuple]:
    """Preprocessing hook: the long-poll views are plain async Django views, which the generator skips;
    document them through schema-only DRF views (``devices.api.BridgePullSchema``/``BridgePushSchema``)."""
    from devices import api

    for name, view in (("devices:api-bridge-pull", api.BridgePullSchema),
                       ("devices:api-bridge-push", api.BridgePushSchema)):
        path = reverse(name)
        endpoints.append((path, f"^{path.lstrip('/')}$", "POST", view.as_view()))
    return endpoints
