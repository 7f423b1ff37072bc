"""One exception hierarchy for the whole platform, rendered in one place.

Services raise ``ApplicationError`` subclasses; the DRF handler below renders them (and DRF's own
errors) as ``{"error": code, "detail": message}``; consumers map the same classes to JSON-RPC errors
or close codes.
"""

from __future__ import annotations

import logging
from typing import Any

from django.core.exceptions import PermissionDenied
from django.db import InterfaceError, OperationalError
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.utils.deprecation import MiddlewareMixin
from rest_framework import exceptions as drf_exceptions
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_default_handler

logger = logging.getLogger(__name__)


class ApplicationError(Exception):
    code = "error"
    status = 400
    default_detail = "The request could not be completed."

    def __init__(self, detail: str | None = None, *, code: str | None = None, status: int | None = None,
                 extra: dict[str, Any] | None = None) -> None:
        self.detail = detail or self.default_detail
        if code:
            self.code = code
        if status:
            self.status = status
        self.extra = extra or {}
        super().__init__(self.detail)

    def as_dict(self) -> dict[str, Any]:
        return {"error": self.code, "detail": self.detail, **self.extra}


class ValidationFailed(ApplicationError):
    code = "invalid"
    status = 400
    default_detail = "The input is not valid."


class NotAuthenticated(ApplicationError):
    code = "not_authenticated"
    status = 401
    default_detail = "Log in first."


class Forbidden(ApplicationError):
    code = "forbidden"
    status = 403
    default_detail = "You may not do this."


class NotFound(ApplicationError):
    code = "not_found"
    status = 404
    default_detail = "Not found."


class Conflict(ApplicationError):
    code = "conflict"
    status = 409
    default_detail = "The object is not in a state that allows this."


class Gone(ApplicationError):
    code = "gone"
    status = 410
    default_detail = "This is no longer available."


class PayloadTooLarge(ApplicationError):
    code = "too_large"
    status = 413
    default_detail = "The input is too large."


class RateLimited(ApplicationError):
    code = "rate_limited"
    status = 429
    default_detail = "Too many attempts. Wait a moment and try again."


class Unavailable(ApplicationError):
    code = "unavailable"
    status = 503
    default_detail = "The service is not available right now."


class DatabaseUnavailable(Unavailable):
    code = "database_unavailable"
    default_detail = "The database cannot be reached for a moment; try again."


class DatabaseErrorMiddleware(MiddlewareMixin):
    """A request whose database connection was dropped (terminated, restarted, failed over) answers 503
    with the error body, never a server-error or traceback page. Django discards the broken connection
    at the end of the request, so the next one gets a fresh one: no restart needed."""

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not isinstance(exception, (OperationalError, InterfaceError)):
            return None  # integrity or programming errors are bugs to see, not an outage
        logger.error("database unavailable for %s %s", request.method, request.path, exc_info=exception)
        error = DatabaseUnavailable()
        if request.path.startswith("/api/"):
            return JsonResponse(error.as_dict(), status=error.status, headers={"Retry-After": "1"})
        return HttpResponse(error.detail, status=error.status, content_type="text/plain; charset=utf-8",
                            headers={"Retry-After": "1"})


def retry_after_header(exc: ApplicationError) -> dict[str, str]:
    """``Retry-After`` for a refusal that names its wait (``ai1net.accounts.ratelimit``)."""
    wait = exc.extra.get("retry_after")
    return {"Retry-After": str(int(wait))} if wait else {}


_DRF_CODES = {
    drf_exceptions.NotAuthenticated: "not_authenticated",
    drf_exceptions.AuthenticationFailed: "authentication_failed",
    drf_exceptions.PermissionDenied: "forbidden",
    drf_exceptions.NotFound: "not_found",
    drf_exceptions.MethodNotAllowed: "method_not_allowed",
    drf_exceptions.ParseError: "parse_error",
    drf_exceptions.UnsupportedMediaType: "unsupported_media_type",
    drf_exceptions.Throttled: "rate_limited",
    drf_exceptions.ValidationError: "invalid",
}


def api_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, ApplicationError):
        return Response(exc.as_dict(), status=exc.status, headers=retry_after_header(exc))
    if isinstance(exc, Http404):
        return Response({"error": "not_found", "detail": "Not found."}, status=404)
    if isinstance(exc, PermissionDenied):
        return Response({"error": "forbidden", "detail": "You may not do this."}, status=403)
    response = drf_default_handler(exc, context)
    if response is None:
        return None
    code = next((c for cls, c in _DRF_CODES.items() if isinstance(exc, cls)), "error")
    if isinstance(exc, drf_exceptions.ValidationError):
        body: dict[str, Any] = {"error": code, "detail": "The input is not valid.", "fields": response.data}
    else:
        detail = response.data.get("detail", "") if isinstance(response.data, dict) else response.data
        body = {"error": code, "detail": str(detail)}
    response.data = body
    return response
