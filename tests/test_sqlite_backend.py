"""ai1net.sqlite_backend: Django's SQLite backend, each statement's placeholders converted once."""

from __future__ import annotations

import pytest
from django.db import connection

from ai1net.sqlite_backend import base

pytestmark = [pytest.mark.django_db,
              pytest.mark.skipif(connection.vendor != "sqlite", reason="the embedded default's backend")]


def test_sqlite_urls_get_our_backend():
    assert connection.settings_dict["ENGINE"] == "ai1net.sqlite_backend"


def test_a_statement_is_converted_once_and_runs_as_djangos_would():
    statement = "SELECT %s || '%%' || %s, 'a%%b' WHERE 1 = %s"
    before = base._qmark.cache_info()
    for _ in range(3):
        with connection.cursor() as cursor:
            cursor.execute(statement, ["x", "y", 1])
            assert cursor.fetchone() == ("x%y", "a%b")
    after = base._qmark.cache_info()
    assert after.misses - before.misses <= 1 and after.hits - before.hits >= 2


def test_named_parameters_still_work():
    with connection.cursor() as cursor:
        cursor.execute("SELECT %(a)s + %(b)s", {"a": 1, "b": 2})
        assert cursor.fetchone() == (3,)
