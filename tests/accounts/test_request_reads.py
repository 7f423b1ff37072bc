"""The read every authenticated request makes, as one written statement: the session row with its user
(ai1net.accounts.sessions), which ``User.objects.get(pk=...)`` (ModelBackend.get_user) takes under the
middleware's ``get_user``, or reads itself, also written. Each must give exactly what Django's ORM path
gives, without building an ORM query."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth import get_user
from django.contrib.sessions.backends import db as django_db_sessions
from django.db import connection
from django.db.models.query import QuerySet
from django.test import RequestFactory
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from ai1net.accounts import sessions
from ai1net.accounts.models import Session, User

pytestmark = pytest.mark.django_db


@pytest.fixture
def no_orm_get(monkeypatch):
    """Fail any QuerySet.get: the fast paths must not build one."""
    def refuse(self, *args, **kwargs):
        raise AssertionError(f"an ORM get of {self.model.__name__}")

    monkeypatch.setattr(QuerySet, "get", refuse)


class SessionStore(django_db_sessions.SessionStore):  # the name: it salts the data's signature
    """Django's own database store (its ORM read), on our table."""

    @classmethod
    def get_model_class(cls):
        return Session


def stored_session(data: dict, *, expires_in: timedelta = timedelta(days=1)) -> str:
    store = sessions.SessionStore()
    store.update(data)
    store.create()
    Session.objects.filter(session_key=store.session_key).update(expire_date=timezone.now() + expires_in)
    return store.session_key


def test_the_session_engine_is_ours():
    from django.conf import settings

    assert settings.SESSION_ENGINE == "ai1net.accounts.sessions"


def test_a_session_loads_as_djangos_database_store_loads_it_in_one_statement():
    key = stored_session({"a": 1, "nested": {"b": [1, 2]}})
    djangos = SessionStore(key).load()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(QuerySet, "get", lambda *args, **kwargs: pytest.fail("an ORM get"))
        with CaptureQueriesContext(connection) as queries:
            data = sessions.SessionStore(key).load()
    assert len(queries) == 1
    assert data == djangos == {"a": 1, "nested": {"b": [1, 2]}}


@pytest.mark.parametrize("case", ["expired", "unknown", "tampered", "no key"])
def test_a_session_that_cannot_be_used_loads_empty_and_loses_its_key(case):
    key = stored_session({"a": 1}, expires_in=timedelta(seconds=-1) if case == "expired" else timedelta(days=1))
    if case == "unknown":
        key = "x" * 32
    if case == "tampered":
        Session.objects.filter(session_key=key).update(session_data="not:signed:data")
    store = sessions.SessionStore(None if case == "no key" else key)
    assert store.load() == {}
    assert store.session_key is None or case == "tampered"  # (Django keeps the key of a tampered row too)
    assert SessionStore(None if case == "no key" else key).load() == {}


def test_the_users_row_by_primary_key_is_the_orms_row_field_by_field(user, no_orm_get):
    User.objects.filter(pk=user.pk).update(last_login=timezone.now(), mobile_reply_enabled=True, otp_epoch=3)
    with CaptureQueriesContext(connection) as queries:
        fast = User.objects.get(pk=user.pk)
        by_text = User.objects.get(pk=str(user.pk))  # the session keeps the id as text
    assert len(queries) == 2
    orm = list(User.objects.filter(pk=user.pk))[0]
    for field in User._meta.concrete_fields:
        value = getattr(fast, field.attname)
        assert value == getattr(orm, field.attname) == getattr(by_text, field.attname), field.name
        assert type(value) is type(getattr(orm, field.attname)), field.name  # bools, aware datetimes
    assert fast.last_login.tzinfo is not None and fast.mobile_reply_enabled is True
    assert fast._state.adding is False and fast._state.db == "default"


def test_a_missing_or_malformed_primary_key_fails_as_the_orm_fails(user):
    with pytest.raises(User.DoesNotExist):
        User.objects.get(pk=user.pk + 1000)
    with pytest.raises(ValueError):
        User.objects.get(pk="not-a-number")
    assert User.objects.get(username="alice") == user  # every other lookup: the ORM as before


def signed_in_request(client, user, password):
    assert client.login(username=user.username, password=password)
    request = RequestFactory().get("/")
    request.session = sessions.SessionStore(client.cookies["sessionid"].value)
    return request


def test_the_session_user_comes_with_the_session_in_one_statement_and_signs_in_as_django_would(client, user,
                                                                                               password):
    request = signed_in_request(client, user, password)
    assert Session.objects.get(session_key=request.session.session_key).user_id == user.pk  # kept on save
    with CaptureQueriesContext(connection) as queries:
        loaded = sessions.get_user(request)
    assert loaded.pk == user.pk and loaded.is_authenticated and loaded.needs_otp_at_load is False
    assert len(queries) == 1
    orm = list(User.objects.filter(pk=user.pk))[0]
    for field in User._meta.concrete_fields:
        assert getattr(loaded, field.attname) == getattr(orm, field.attname), field.name
    request.session = sessions.SessionStore(request.session.session_key)
    with CaptureQueriesContext(connection) as queries:
        assert get_user(request).pk == user.pk  # Django's own get_user: the user read by itself
    assert len(queries) == 2
    User.objects.filter(pk=user.pk).update(password="changed")  # a password change ends the session
    request.session = sessions.SessionStore(request.session.session_key)
    assert not sessions.get_user(request).is_authenticated


def test_the_middleware_reads_session_and_user_once_and_answers_two_factor_with_them(client, user, password):
    from django.contrib.sessions.middleware import SessionMiddleware
    from django_otp.plugins.otp_totp.models import TOTPDevice

    TOTPDevice.objects.create(user=user, name="phone", confirmed=True)
    assert client.login(username=user.username, password=password)
    request = RequestFactory().get("/", HTTP_COOKIE=f"sessionid={client.cookies['sessionid'].value}")
    SessionMiddleware(lambda r: None).process_request(request)
    sessions.AuthenticationMiddleware(lambda r: None).process_request(request)
    with CaptureQueriesContext(connection) as queries:
        assert request.user.pk == user.pk and request.user.needs_otp_at_load is True
    assert len(queries) == 1


def test_a_user_read_with_the_session_serves_only_the_user_its_data_names(client, user, other_user, password):
    request = signed_in_request(client, user, password)
    Session.objects.filter(session_key=request.session.session_key).update(user=other_user)
    with CaptureQueriesContext(connection) as queries:
        loaded = sessions.get_user(request)
    assert loaded.pk == user.pk and len(queries) == 2  # the joined row was someone else's: read the named one
    request.session = sessions.SessionStore(request.session.session_key)
    request.session.load()
    assert request.session.loaded_user.pk == other_user.pk
    assert User.objects.get(pk=other_user.pk) is not request.session.loaded_user  # outside get_user: a read


def test_deleting_a_user_ends_their_sessions(client, user, password):
    request = signed_in_request(client, user, password)
    user.delete()
    assert not Session.objects.filter(session_key=request.session.session_key).exists()


def test_api_views_get_the_user_itself_not_the_middlewares_lazy_proxies(phone, bridge, monkeypatch):
    """AuthenticationMiddleware and django-otp's middleware each wrap the user in a lazy proxy; DRF's session
    authentication (ours) hands the view, the service and Django's request the User object itself, with the
    OTP middleware's fields on it, and still checks CSRF."""
    from django.test import Client
    from django.utils.functional import LazyObject

    from mobile import services as mobile_services
    from tests.mobile.factories import ask

    seen = {}

    def answer_submit(*, actor, **kwargs):
        seen["actor"] = actor
        return {"state": "answered"}

    monkeypatch.setattr(mobile_services, "answer_submit", answer_submit)
    question, nonce = ask(bridge)
    body = {"question_id": str(question.pk), "nonce": nonce, "answers": {"Which framework?": ["Vue"]}}
    response = phone.post("/api/mobile/answer", body, content_type="application/json")
    assert response.status_code == 200, response.content
    actor = seen["actor"]
    assert type(actor) is User and not isinstance(actor, LazyObject)
    assert actor.pk == bridge.owner_id and actor.is_verified() is False and actor.otp_device is None

    browser = Client(enforce_csrf_checks=True)
    browser.force_login(bridge.owner)
    refused = browser.post("/api/mobile/answer", body, content_type="application/json")
    assert refused.status_code == 403 and "CSRF" in refused.json()["detail"]


def test_unwrapped_evaluates_each_lazy_proxy_once():
    from django.utils.functional import SimpleLazyObject

    from ai1net.accounts.authentication import unwrapped

    made = []
    user = User(username="u")
    inner = SimpleLazyObject(lambda: made.append("inner") or user)
    outer = SimpleLazyObject(lambda: made.append("outer") or inner)
    assert unwrapped(outer) is user and made == ["outer", "inner"]
    assert unwrapped(outer) is user and made == ["outer", "inner"]
    assert unwrapped(user) is user and unwrapped(None) is None
