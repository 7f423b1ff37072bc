"""Django's database sessions (the same rows and cookie, in ``accounts.Session``), with the read every
request makes as one written statement that brings the session's user too: the ORM built and compiled
``Session.objects.get(session_key=..., expire_date__gt=now)`` anew on each request (237 µs against 28 µs
for the statement itself, warm, in one process), and the user was a second round trip to the database.

``SESSION_ENGINE = "ai1net.accounts.sessions"``, with ``ai1net.accounts.sessions.AuthenticationMiddleware``
in place of Django's: ``get_user`` hands ``django.contrib.auth.get_user`` the user read with the session
(``User.objects.get(pk=...)`` takes it, ``user_read_with_session``) when it is the user the data names.
"""

from __future__ import annotations

import functools
from contextvars import ContextVar
from typing import Any

from django.contrib import auth
from django.contrib.auth import SESSION_KEY
from django.contrib.auth.middleware import AuthenticationMiddleware as DjangosAuthenticationMiddleware
from django.contrib.sessions.backends import db
from django.db import connections, router
from django.utils import timezone
from django.utils.functional import SimpleLazyObject

from ai1net import sql


@functools.cache
def _load_sql(vendor: str) -> str:
    from ai1net.accounts.models import Session, User
    from ai1net.accounts.selectors import needs_otp_sql

    quote = connections[router.db_for_read(Session)].ops.quote_name
    session, user = Session._meta, User._meta
    # Names from the models' _meta, values as parameters (the two-factor read's first).
    return (
        f"SELECT s.{quote('session_data')}, {sql.columns_of(vendor, User, 'u')}, "  # noqa: S608
        f"({needs_otp_sql(vendor, f'u.{quote(user.pk.column)}')}) "
        f"FROM {quote(session.db_table)} s LEFT JOIN {quote(user.db_table)} u "
        f"ON u.{quote(user.pk.column)} = s.{quote(session.get_field('user').column)} "
        f"WHERE s.{quote('session_key')} = %s AND s.{quote('expire_date')} > %s")


class SessionStore(db.SessionStore):
    # The user row read with the session's (its ``needs_otp_at_load`` answered), until ``get_user`` takes it.
    loaded_user: Any = None

    @classmethod
    def get_model_class(cls) -> type:
        from ai1net.accounts.models import Session

        return Session

    def create_model_instance(self, data: dict[str, Any]) -> Any:
        session = super().create_model_instance(data)
        session.user_id = _user_id(data.get(SESSION_KEY))
        return session

    def load(self) -> dict[str, Any]:
        """What ``db.SessionStore.load`` returns: the data of the unexpired row of this key, else {} and
        no key (a new one is made on save). The row's user comes with it (``loaded_user``)."""
        from ai1net.accounts.models import User
        from ai1net.accounts.selectors import NEEDS_OTP_PARAMS_FOR_COLUMN

        self.loaded_user = None
        key = self.session_key
        if not key:
            self._session_key = None
            return {}
        connection = connections[router.db_for_read(self.model)]
        with connection.cursor() as cursor:
            cursor.execute(_load_sql(connection.vendor), [
                *NEEDS_OTP_PARAMS_FOR_COLUMN, key, connection.ops.adapt_datetimefield_value(timezone.now())])
            row = cursor.fetchone()
        if row is None:
            self._session_key = None
            return {}
        if row[1] is not None:  # the user's primary key: a user row was joined
            user = sql.from_row(User, row[1:])
            user.needs_otp_at_load = bool(row[-1])
            self.loaded_user = user
        return self.decode(row[0])


def _user_id(value: Any) -> int | None:
    text = str(value)
    return int(text) if value is not None and text.isdigit() else None


# The session whose user ``django.contrib.auth.get_user`` is reading now, in this context.
_reading_user_of: ContextVar[SessionStore | None] = ContextVar("ai1net_reading_user_of", default=None)


def get_user(request: Any) -> Any:
    """``django.contrib.auth.get_user(request)`` (every check it makes), handed the user read with the
    session's row for the one read of the user by key it makes (``user_read_with_session``)."""
    token = _reading_user_of.set(request.session)
    try:
        return auth.get_user(request)
    finally:
        _reading_user_of.reset(token)


def user_read_with_session(pk: Any) -> Any:
    """The user read with the session whose user ``get_user`` is reading, when it is user ``pk``; taken
    once. None otherwise (read it)."""
    session = _reading_user_of.get()
    if session is None or not isinstance(session, SessionStore):
        return None
    user, session.loaded_user = session.loaded_user, None
    return user if user is not None and user.pk == pk else None


class AuthenticationMiddleware(DjangosAuthenticationMiddleware):
    """Django's, its lazy ``request.user`` resolved by ``get_user`` above."""

    def process_request(self, request: Any) -> None:
        super().process_request(request)
        request.user = SimpleLazyObject(lambda: _cached_user(request))


def _cached_user(request: Any) -> Any:
    if not hasattr(request, "_cached_user"):
        request._cached_user = get_user(request)
    return request._cached_user
