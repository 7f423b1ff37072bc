"""The bridge's on-disk state for mobile reply (SQLite, `<home>/mobile.sqlite3`).

Answers and phone messages are written here as they are delivered, so they survive a restart of the
daemon; every state change is one conditional UPDATE whose row count decides who won (a waiting hook
taking an answer versus a give-up, a delivery replayed after a reconnect, ...).
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

SCHEMA = """
CREATE TABLE IF NOT EXISTS questions (
    question_id TEXT PRIMARY KEY,
    session_id TEXT NOT NULL,
    tool_use_id TEXT NOT NULL,
    tool_input TEXT NOT NULL,
    window_sec REAL NOT NULL,
    state TEXT NOT NULL,            -- asking | pending | answered | taken | moved | closed | failed | desktop
    reason TEXT NOT NULL DEFAULT '',
    answers TEXT,                   -- {question text: [labels]}
    other TEXT,                     -- {question text: free text}
    created_at REAL NOT NULL,
    deadline REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS questions_tool_use ON questions (tool_use_id);
CREATE TABLE IF NOT EXISTS messages (
    message_id TEXT PRIMARY KEY,
    session_id TEXT NOT NULL,
    text TEXT NOT NULL,
    state TEXT NOT NULL,            -- queued | consumed
    received_at REAL NOT NULL,
    consumed_at REAL
);
CREATE INDEX IF NOT EXISTS messages_session ON messages (session_id, state);
CREATE TABLE IF NOT EXISTS sessions (
    session_id TEXT PRIMARY KEY,
    started INTEGER NOT NULL DEFAULT 0,
    ended INTEGER NOT NULL DEFAULT 0,
    keep_going INTEGER NOT NULL DEFAULT 0,
    stop_blocks INTEGER NOT NULL DEFAULT 0,
    room_id TEXT NOT NULL DEFAULT '',
    info TEXT NOT NULL DEFAULT '{}',
    updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS reports (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    method TEXT NOT NULL,
    params TEXT NOT NULL,
    created_at REAL NOT NULL,
    done_at REAL,
    outcome TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS kv (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS remembered (  -- "Allow and remember for this session", per exact tool input
    session_id TEXT NOT NULL,
    tool_name TEXT NOT NULL,
    input_hash TEXT NOT NULL,
    question_id TEXT NOT NULL,
    created_at REAL NOT NULL,
    PRIMARY KEY (session_id, tool_name, input_hash)
);
"""
# Added after the first release: a store written by an older bridge gains them when opened.
COLUMNS_ADDED = (("questions", "kind", "TEXT NOT NULL DEFAULT 'question'"),)

OPEN_STATES = ("asking", "pending", "answered")


class Store:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.RLock()
        self._db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None, timeout=10)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(SCHEMA)
        for table, column, spec in COLUMNS_ADDED:
            if column not in {row["name"] for row in self._db.execute(f"PRAGMA table_info({table})")}:
                self._db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {spec}")
        try:
            self.path.chmod(0o600)
        except OSError:
            pass

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _run(self, sql: str, args: tuple = ()) -> int:
        with self._lock:
            return self._db.execute(sql, args).rowcount

    def _all(self, sql: str, args: tuple = ()) -> List[Dict[str, Any]]:
        with self._lock:
            return [dict(row) for row in self._db.execute(sql, args).fetchall()]

    def _one(self, sql: str, args: tuple = ()) -> Optional[Dict[str, Any]]:
        rows = self._all(sql, args)
        return rows[0] if rows else None

    # --- questions ---------------------------------------------------------------------------
    def question_insert(
        self, *, question_id: str, session_id: str, tool_use_id: str, tool_input: dict, window_sec: float,
        kind: str = "question",
    ) -> None:
        """``kind`` "permission": ``tool_input`` is {tool_name, tool_input, input_hash} (clients.permission)."""
        now = time.time()
        self._run(
            "INSERT INTO questions (question_id, session_id, tool_use_id, tool_input, window_sec, state, created_at,"
            " deadline, updated_at, kind) VALUES (?, ?, ?, ?, ?, 'asking', ?, ?, ?, ?)",
            (question_id, session_id, tool_use_id, json.dumps(tool_input), window_sec, now, now + window_sec, now,
             kind),
        )

    def question(self, question_id: str) -> Optional[Dict[str, Any]]:
        row = self._one("SELECT * FROM questions WHERE question_id = ?", (question_id,))
        return _decode_question(row) if row else None

    def question_for_tool_use(self, tool_use_id: str) -> Optional[Dict[str, Any]]:
        row = self._one(
            "SELECT * FROM questions WHERE tool_use_id = ? ORDER BY created_at DESC LIMIT 1", (tool_use_id,)
        )
        return _decode_question(row) if row else None

    def questions_open(self, session_id: Optional[str] = None) -> List[Dict[str, Any]]:
        sql = "SELECT * FROM questions WHERE state IN ('asking', 'pending', 'answered')"
        args: tuple = ()
        if session_id is not None:
            sql += " AND session_id = ?"
            args = (session_id,)
        return [_decode_question(row) for row in self._all(sql + " ORDER BY created_at", args)]

    def question_transition(self, question_id: str, from_states: tuple, to_state: str, reason: str = "") -> bool:
        marks = ", ".join("?" for _ in from_states)
        return (
            self._run(
                "UPDATE questions SET state = ?, reason = ?, updated_at = ?"  # noqa: S608 - placeholders only
                f" WHERE question_id = ? AND state IN ({marks})",
                (to_state, reason, time.time(), question_id, *from_states),
            )
            == 1
        )

    def question_answer(self, question_id: str, answers: dict, other: dict) -> bool:
        """Store the phone's answer once; only a question still waiting for it can take it."""
        return (
            self._run(
                "UPDATE questions SET state = 'answered', answers = ?, other = ?, updated_at = ?"
                " WHERE question_id = ? AND state IN ('asking', 'pending')",
                (json.dumps(answers), json.dumps(other), time.time(), question_id),
            )
            == 1
        )

    # --- messages ----------------------------------------------------------------------------
    def message_insert(self, *, message_id: str, session_id: str, text: str) -> bool:
        return (
            self._run(
                "INSERT OR IGNORE INTO messages (message_id, session_id, text, state, received_at)"
                " VALUES (?, ?, ?, 'queued', ?)",
                (message_id, session_id, text, time.time()),
            )
            == 1
        )

    def messages_queued(self, session_id: str) -> List[Dict[str, Any]]:
        return self._all(
            "SELECT * FROM messages WHERE session_id = ? AND state = 'queued' ORDER BY received_at, rowid",
            (session_id,),
        )

    def message_consume(self, message_id: str) -> bool:
        return (
            self._run(
                "UPDATE messages SET state = 'consumed', consumed_at = ? WHERE message_id = ? AND state = 'queued'",
                (time.time(), message_id),
            )
            == 1
        )

    def queue_depth(self) -> int:
        row = self._one("SELECT COUNT(*) AS n FROM messages WHERE state = 'queued'")
        return int(row["n"]) if row else 0

    # --- sessions ----------------------------------------------------------------------------
    def session(self, session_id: str) -> Optional[Dict[str, Any]]:
        return self._one("SELECT * FROM sessions WHERE session_id = ?", (session_id,))

    def session_upsert(self, session_id: str, **fields: Any) -> None:
        with self._lock:
            self._run(
                "INSERT OR IGNORE INTO sessions (session_id, updated_at) VALUES (?, ?)", (session_id, time.time())
            )
            for key, value in fields.items():
                if key not in ("started", "ended", "keep_going", "stop_blocks", "room_id", "info"):
                    raise ValueError(key)
                self._run(
                    f"UPDATE sessions SET {key} = ?, updated_at = ? WHERE session_id = ?",  # noqa: S608 - checked key
                    (value, time.time(), session_id),
                )

    # --- reports to the platform (durable, retried in order) ---------------------------------
    def report_add(self, method: str, params: dict) -> int:
        with self._lock:
            cursor = self._db.execute(
                "INSERT INTO reports (method, params, created_at) VALUES (?, ?, ?)",
                (method, json.dumps(params), time.time()),
            )
            return int(cursor.lastrowid or 0)

    def reports_pending(self) -> List[Dict[str, Any]]:
        rows = self._all("SELECT * FROM reports WHERE done_at IS NULL ORDER BY id")
        for row in rows:
            row["params"] = json.loads(row["params"])
        return rows

    def report_done(self, report_id: int, outcome: str) -> None:
        self._run("UPDATE reports SET done_at = ?, outcome = ? WHERE id = ?", (time.time(), outcome, report_id))

    # --- remembered tool calls ("Allow and remember for this session") ---------------------
    def remember(self, *, session_id: str, tool_name: str, input_hash: str, question_id: str) -> None:
        self._run(
            "INSERT OR IGNORE INTO remembered (session_id, tool_name, input_hash, question_id, created_at)"
            " VALUES (?, ?, ?, ?, ?)",
            (session_id, tool_name, input_hash, question_id, time.time()),
        )

    def remembered(self, *, session_id: str, tool_name: str, input_hash: str) -> Optional[str]:
        """The question whose answer allowed this very call for the session, or None."""
        row = self._one(
            "SELECT question_id FROM remembered WHERE session_id = ? AND tool_name = ? AND input_hash = ?",
            (session_id, tool_name, input_hash),
        )
        return str(row["question_id"]) if row else None

    def forget_session(self, session_id: str) -> None:
        self._run("DELETE FROM remembered WHERE session_id = ?", (session_id,))

    # --- key/value ---------------------------------------------------------------------------
    def get(self, key: str, default: Any = None) -> Any:
        row = self._one("SELECT value FROM kv WHERE key = ?", (key,))
        return json.loads(row["value"]) if row else default

    def set(self, key: str, value: Any) -> None:
        self._run("INSERT OR REPLACE INTO kv (key, value) VALUES (?, ?)", (key, json.dumps(value)))


def _decode_question(row: Dict[str, Any]) -> Dict[str, Any]:
    row["tool_input"] = json.loads(row["tool_input"])
    row["answers"] = json.loads(row["answers"]) if row.get("answers") else None
    row["other"] = json.loads(row["other"]) if row.get("other") else None
    return row
