"""A request whose database connection is gone answers 503 with the error body (ai1net.exceptions.
DatabaseErrorMiddleware), never a server-error or traceback page; bugs stay server errors. The real
fault, with PostgreSQL backends terminated under load: tests/faults/test_pg_terminate.py."""

from __future__ import annotations

import pytest
from django.db import InterfaceError, OperationalError, ProgrammingError

pytestmark = pytest.mark.django_db


@pytest.fixture
def phone(api, user):
    user.mobile_reply_enabled = True
    user.save(update_fields=["mobile_reply_enabled"])
    return api


@pytest.mark.parametrize("error", [OperationalError("terminating connection due to administrator command"),
                                   InterfaceError("connection already closed")])
def test_a_lost_connection_is_a_503_with_the_error_body(phone, monkeypatch, settings, error):
    settings.DEBUG = True  # even where a traceback page would otherwise be shown

    def lost(**kwargs):
        raise error

    monkeypatch.setattr("mobile.selectors.mobile_state", lost)
    response = phone.get("/api/mobile/state")
    assert response.status_code == 503
    assert response["Content-Type"] == "application/json"
    assert response["Retry-After"] == "1"
    assert response.json() == {"error": "database_unavailable",
                               "detail": "The database cannot be reached for a moment; try again."}
    assert phone.get("/api/mobile/pending").status_code == 200  # the next request is served


def test_a_page_gets_a_plain_503(api, monkeypatch):
    def lost(*args, **kwargs):
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr("devices.views.render", lost)
    response = api.get("/devices/")
    assert (response.status_code, response["Content-Type"]) == (503, "text/plain; charset=utf-8")
    assert b"Traceback" not in response.content


def test_a_programming_error_is_still_a_server_error(phone, monkeypatch):
    def bug(**kwargs):
        raise ProgrammingError("no such column")

    monkeypatch.setattr("mobile.selectors.mobile_state", bug)
    with pytest.raises(ProgrammingError):
        phone.get("/api/mobile/state")
