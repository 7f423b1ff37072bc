from __future__ import annotations

import datetime as dt
import re
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.utils import timezone

from ai1net.accounts.models import FirstRunToken

pytestmark = pytest.mark.django_db

FORM = {"username": "op", "email": "op@example.com", "password1": "a long operator pass 9", "password2":
        "a long operator pass 9"}


def _link() -> str:
    out = StringIO()
    call_command("first_run_link", "--public-url", "http://127.0.0.1:8000", stdout=out)
    match = re.search(r"http://127\.0\.0\.1:8000(/setup/[A-Za-z0-9_\-]+)", out.getvalue())
    assert match, out.getvalue()
    return match.group(1)


def test_link_creates_first_operator_once(client):
    path = _link()
    assert FirstRunToken.objects.get().token_hash not in path, "only the hash is stored"
    assert client.get(path).status_code == 200
    response = client.post(path, FORM)
    assert response.status_code == 302 and response["Location"] == "/accounts/"
    operator = get_user_model().objects.get()
    assert operator.is_superuser and operator.is_staff and operator.username == "op"
    assert client.session["_auth_user_id"] == str(operator.pk)
    # Used: the same link is gone, even for a fresh browser.
    client.logout()
    assert client.get(path).status_code == 404
    assert client.post(path, {**FORM, "username": "op2"}).status_code == 404
    assert get_user_model().objects.count() == 1


def test_link_expires(client):
    path = _link()
    FirstRunToken.objects.update(expires_at=timezone.now() - dt.timedelta(seconds=1))
    assert client.get(path).status_code == 404
    assert client.post(path, FORM).status_code == 404
    assert not get_user_model().objects.exists()


def test_new_link_replaces_old_one(client):
    old = _link()
    new = _link()
    assert client.get(old).status_code == 404
    assert client.get(new).status_code == 200


def test_invalid_form_does_not_burn_link(client):
    path = _link()
    response = client.post(path, {**FORM, "password2": "different"})
    assert response.status_code == 200
    assert client.post(path, FORM).status_code == 302


def test_nothing_printed_when_users_exist(user):
    out = StringIO()
    call_command("first_run_link", "--public-url", "http://127.0.0.1:8000", stdout=out)
    assert out.getvalue() == ""
    assert not FirstRunToken.objects.exists()


def test_link_dead_once_someone_created_a_user(client, django_user_model):
    path = _link()
    django_user_model.objects.create_superuser(username="via-createsuperuser", password="x-long-password-1")
    assert client.get(path).status_code == 404


def test_bad_token_404(client):
    _link()
    assert client.get("/setup/not-the-token").status_code == 404


def test_createsuperuser_works_too(monkeypatch, client):
    monkeypatch.setenv("DJANGO_SUPERUSER_PASSWORD", "a long operator pass 9")
    call_command("createsuperuser", interactive=False, username="admin", email="admin@example.com",
                 stdout=StringIO())
    operator = get_user_model().objects.get(username="admin")
    assert operator.is_superuser and operator.check_password("a long operator pass 9")
    assert not operator.mobile_reply_enabled and not operator.device_web_enabled
