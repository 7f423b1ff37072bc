"""accounts 0007: Django's session rows move to accounts.Session, each with the user its data names."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from ai1net.accounts import sessions

BEFORE = [("accounts", "0006_audit_head_prev_hash"), ("sessions", "0001_initial")]
AFTER = [("accounts", "0007_session_with_user")]


def migrated_to(targets):
    executor = MigrationExecutor(connection)
    executor.migrate(targets)
    executor.loader.build_graph()
    return executor.loader.project_state(targets).apps


@pytest.mark.django_db(transaction=True)
def test_signed_in_sessions_move_with_their_users_and_back():
    apps = migrated_to(BEFORE)
    try:
        user = apps.get_model("accounts", "User").objects.create(username="alice", password="x")
        old = apps.get_model("sessions", "Session")
        expires = timezone.now() + timedelta(days=1)
        store = sessions.SessionStore()  # the data as a signed-in request saved it, signed as ours signs
        for key, data in [("k" * 32, {"_auth_user_id": str(user.pk), "x": 1}), ("g" * 32, {"x": 2}),
                          ("d" * 32, {"_auth_user_id": str(user.pk + 99)}), ("t" * 32, None)]:
            old.objects.create(session_key=key, session_data=store.encode(data) if data else "tampered",
                               expire_date=expires)

        apps = migrated_to(AFTER)
        moved = {row.session_key: row for row in apps.get_model("accounts", "Session").objects.all()}
        assert {key: row.user_id for key, row in moved.items()} == {
            "k" * 32: user.pk, "g" * 32: None, "d" * 32: None, "t" * 32: None}  # a deleted user: none
        assert store.decode(moved["k" * 32].session_data) == {"_auth_user_id": str(user.pk), "x": 1}
        assert not apps.get_model("sessions", "Session").objects.exists()  # no copy left behind
        loaded = sessions.SessionStore("k" * 32)
        assert loaded.load()["x"] == 1 and loaded.loaded_user.pk == user.pk

        apps = migrated_to(BEFORE)
        assert set(apps.get_model("sessions", "Session").objects.values_list("session_key", flat=True)) == set(moved)
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
