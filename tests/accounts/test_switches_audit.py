from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import Client

from ai1net.accounts import selectors, services
from ai1net.accounts.models import AuditEntry
from ai1net.accounts.signals import switch_changed

pytestmark = pytest.mark.django_db


@pytest.fixture
def operator(django_user_model, password):
    return django_user_model.objects.create_superuser(username="root", password=password)


def test_switches_start_off(user):
    assert user.mobile_reply_enabled is False and user.device_web_enabled is False
    assert not selectors.mobile_reply_active(user) and not selectors.device_web_active(user)


def test_switch_change_is_audited_and_announced_after_commit(user, operator, django_capture_on_commit_callbacks):
    received = []

    def receiver(sender, user, switch, enabled, **kwargs):
        received.append((user.pk, switch, enabled))

    switch_changed.connect(receiver)
    try:
        with django_capture_on_commit_callbacks(execute=False) as callbacks:
            assert services.user_switch_set(actor=operator, user=user, switch="device_web", enabled=True,
                                            ip="192.0.2.7") is True
        assert received == [], "the signal must wait for the commit"
        for callback in callbacks:
            callback()
        assert received == [(user.pk, "device_web", True)]
    finally:
        switch_changed.disconnect(receiver)

    user.refresh_from_db()
    assert user.device_web_enabled is True
    entry = AuditEntry.objects.get(action="accounts.switch.device_web")
    assert entry.actor == operator and entry.subject == user
    assert entry.data == {"switch": "device_web", "old": False, "new": True}
    assert entry.ip == "192.0.2.7" and entry.created_at is not None
    assert entry.actor_label == f"root (#{operator.pk})"


def test_unchanged_switch_records_nothing(user):
    assert services.user_switch_set(actor=user, user=user, switch="mobile_reply", enabled=False) is False
    assert not AuditEntry.objects.exists()


def test_unknown_switch_refused(user):
    with pytest.raises(services.ValidationFailed):
        services.user_switch_set(actor=user, user=user, switch="teleport", enabled=True)


def test_global_stop_overrides_every_user(user, settings):
    services.user_switch_set(actor=user, user=user, switch="mobile_reply", enabled=True)
    services.user_switch_set(actor=user, user=user, switch="device_web", enabled=True)
    assert selectors.mobile_reply_active(user) and selectors.device_web_active(user)
    settings.MOBILE_REPLY_ENABLED = False
    assert not selectors.mobile_reply_active(user) and selectors.device_web_active(user)
    settings.DEVICE_WEB_ENABLED = False
    assert not selectors.device_web_active(user)
    user.refresh_from_db()
    assert user.mobile_reply_enabled, "the stop overrides; it does not rewrite the user's own switch"


def test_user_changes_own_mobile_reply_on_account_page(api, user):
    response = api.post("/accounts/mobile-reply/", {"enabled": "1"}, REMOTE_ADDR="198.51.100.4")
    assert response.status_code == 302
    user.refresh_from_db()
    assert user.mobile_reply_enabled
    entry = AuditEntry.objects.get()
    assert (entry.actor, entry.subject, entry.ip) == (user, user, "198.51.100.4")
    page = api.get("/accounts/")
    assert b"Turn off" in page.content


def test_account_page_shows_global_stop(api, user, settings):
    settings.MOBILE_REPLY_ENABLED = False
    assert b"stopped mobile reply for everybody" in api.get("/accounts/").content


def test_switch_post_keeps_csrf(user):
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    assert client.post("/accounts/mobile-reply/", {"enabled": "1"}).status_code == 403
    user.refresh_from_db()
    assert not user.mobile_reply_enabled


def _make_chain(user, n=4):
    for i in range(n):
        services.audit_record(actor=user, subject=user, action="test.event", data={"i": i, "text": "ünï"}, ip="::1")
    return list(AuditEntry.objects.order_by("id"))


def test_audit_chain_links_and_verifies(user, capsys):
    entries = _make_chain(user)
    assert entries[0].prev_hash == AuditEntry.GENESIS
    for before, after in zip(entries, entries[1:], strict=False):
        assert after.prev_hash == before.hash
    assert selectors.audit_chain_verify() == (4, None)
    call_command("verify_audit_chain")
    assert "audit chain ok: 4 entries" in capsys.readouterr().out


def test_tampered_audit_row_detected(user):
    entries = _make_chain(user)
    target = entries[2]
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {AuditEntry._meta.db_table} SET action = %s WHERE id = %s", ["test.forged", target.pk])
    with pytest.raises(CommandError, match=f"entry #{target.pk}"):
        call_command("verify_audit_chain")


def test_removed_audit_row_detected(user):
    entries = _make_chain(user)
    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {AuditEntry._meta.db_table} WHERE id = %s", [entries[1].pk])
    checked, broken = selectors.audit_chain_verify()
    assert broken is not None and broken.entry_id == entries[2].pk and checked == 1


def test_audit_log_is_append_only(user):
    entry = _make_chain(user, n=1)[0]
    entry.action = "changed"
    with pytest.raises(TypeError):
        entry.save()
    with pytest.raises(TypeError):
        entry.delete()
    with pytest.raises(TypeError):
        AuditEntry.objects.all().delete()
    with pytest.raises(TypeError):
        AuditEntry.objects.update(action="x")
    assert AuditEntry.objects.get().action == "test.event"


def test_deleting_a_user_keeps_the_chain_valid(user, django_user_model):
    other = django_user_model.objects.create_user(username="bob", password="x-long-password-1")
    services.audit_record(actor=other, subject=user, action="test.event", data={})
    other.delete()
    assert AuditEntry.objects.get().actor is None
    assert selectors.audit_chain_verify() == (1, None)


@pytest.mark.django_db(transaction=True)
def test_concurrent_appends_never_fork_the_chain(user):
    import threading

    from django.db import connections

    errors = []

    def worker(n):
        try:
            for i in range(8):
                services.audit_record(actor=None, action="test.concurrent", data={"worker": n, "i": i})
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors
    assert AuditEntry.objects.count() == 32
    assert selectors.audit_chain_verify() == (32, None)


def test_the_chain_head_follows_every_append_and_reseeds_itself(user, django_assert_num_queries):
    """``AuditHead`` holds the newest hash. On PostgreSQL an append is one statement (lock the head, hash
    the entry onto it in the database, insert, move the head); elsewhere the lock and read are one and the
    insert and move two more. A missing head (first append, or flushed tables) is seeded from the newest
    entry, so the chain goes on unbroken."""
    from ai1net.accounts.models import AuditHead

    entries = _make_chain(user, n=2)
    assert AuditHead.objects.get().hash == entries[-1].hash
    with django_assert_num_queries(1 if connection.vendor == "postgresql" else 3):
        entry = services.audit_record(actor=user, action="test.event", data={"n": 3, "text": 'ü "q" \\ \u2028'},
                                      ip="::1")
    assert entry.pk and entry.prev_hash == entries[-1].hash
    stored = AuditEntry.objects.get(pk=entry.pk)
    assert stored.hash == entry.hash == AuditHead.objects.get().hash and stored.prev_hash == entry.prev_hash
    assert entry.hash == services.audit_hash(prev_hash=entry.prev_hash, created_at=stored.created_at,
                                             action=stored.action, actor_label=stored.actor_label,
                                             subject_label=stored.subject_label, data=stored.data, ip=stored.ip)
    AuditHead.objects.all().delete()
    again = services.audit_record(actor=None, action="test.event", data={})
    assert again.prev_hash == entry.hash
    assert selectors.audit_chain_verify() == (4, None)


@pytest.mark.parametrize("data", [{}, {"n": 1, "nested": {"b": [1, "two"], "a": None}},
                                  {"text": 'ünï "quoted" \\ back\nslash \u2028 \U0001f600', "z": 1.5}])
def test_the_hash_around_the_previous_hash_is_the_entrys_hash(data):
    """The text PostgreSQL hashes an entry onto the locked head with is audit_hash's own canonical text."""
    import datetime as dt
    import hashlib

    fields = {"created_at": dt.datetime(2026, 12, 5, 1, 2, 3, 456789, tzinfo=dt.UTC), "action": "test.event",
              "actor_label": 'al"ice (#1)', "subject_label": "bøb (#2)", "data": data, "ip": "::1"}
    before, after = services.audit_hash_around(**fields)
    for prev in (AuditEntry.GENESIS, hashlib.sha256(b"x").hexdigest()):
        assert hashlib.sha256((before + prev + after).encode()).hexdigest() == services.audit_hash(
            prev_hash=prev, **fields)
