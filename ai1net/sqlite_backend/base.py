"""Django's SQLite backend, with each statement's placeholders converted once, not on every execute.

Python's sqlite3 takes ``?`` where Django writes ``%s``; Django's cursor rewrites every statement with a
regular expression on every execute (15 µs for a 400-character SELECT; ``convert_query`` was 5% of an
answer POST's request thread in py-spy on daphne). The statements Django and we run are few and
repeat, so the rewritten text is kept (an LRU of ``CONVERTED_KEPT`` statements).

Where a thread of this process checkpoints the database's write-ahead log (``checkpoints``), new
connections leave the checkpoints to it.

``DATABASES["default"]["ENGINE"] = "ai1net.sqlite_backend"`` (ai1net.settings does it for sqlite URLs).
"""

from __future__ import annotations

import functools
from typing import Any

from django.db.backends.sqlite3 import base

from ai1net.sqlite_backend import checkpoints

CONVERTED_KEPT = 1024


@functools.lru_cache(maxsize=CONVERTED_KEPT)
def _qmark(query: str) -> str:
    return base.FORMAT_QMARK_REGEX.sub("?", query).replace("%%", "%")


class CursorWrapper(base.SQLiteCursorWrapper):
    def convert_query(self, query: str, *, param_names: Any = None) -> str:
        if param_names is None:  # "format" style, as Django's: %s -> ?, %% -> %
            return _qmark(query)
        return super().convert_query(query, param_names=param_names)


class DatabaseWrapper(base.DatabaseWrapper):
    def get_new_connection(self, conn_params: Any) -> Any:
        connection = super().get_new_connection(conn_params)
        if checkpoints.running_for(self.settings_dict["NAME"]):
            connection.execute(f"PRAGMA wal_autocheckpoint = {checkpoints.BACKSTOP_PAGES}")
        return connection

    def create_cursor(self, name: Any = None) -> Any:
        return self.connection.cursor(factory=CursorWrapper)
