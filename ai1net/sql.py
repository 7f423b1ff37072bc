"""Statements written once per model and database vendor, for rows read and written on every hot request.

Django's ``Model.save()`` builds and compiles its INSERT anew on every call: on an answer POST the two
ORM inserts (the answer, its room message) were 18% of the request thread in a py-spy profile of
daphne, more than the statements themselves.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connection, connections, models, router
from django.db.models import signals

_inserts: dict[tuple[str, str], str] = {}  # (vendor, model label) -> INSERT ... RETURNING pk


def _insert_sql(connection: Any, meta: Any, fields: list[Any]) -> str:
    key = (connection.vendor, meta.label)
    sql = _inserts.get(key)
    if sql is None:
        quote = connection.ops.quote_name
        # Names from the model's _meta, values as parameters.
        sql = _inserts[key] = (
            f"INSERT INTO {quote(meta.db_table)} ({', '.join(quote(f.column) for f in fields)}) "  # noqa: S608
            f"VALUES ({', '.join(['%s'] * len(fields))}) RETURNING {quote(meta.pk.column)}")
    return sql


def _prepared(obj: models.Model, connection: Any) -> tuple[list[Any], list[Any]]:
    """The columns an INSERT of ``obj`` writes and their values, prepared as ``save()`` prepares them
    (``pre_save``, e.g. ``auto_now_add``; ``get_db_prep_save``)."""
    fields = [field for field in obj._meta.concrete_fields if not field.primary_key]
    return fields, [field.get_db_prep_save(field.pre_save(obj, True), connection) for field in fields]


def insert(obj: models.Model) -> models.Model:
    """``obj.save(force_insert=True)`` for a new row whose primary key the database assigns, in one
    statement: the same field preparation (``pre_save``, e.g. ``auto_now_add``; ``get_db_prep_save``).
    A model with save signal receivers, or a backend without INSERT ... RETURNING, takes ``save()``."""
    model, meta = type(obj), obj._meta
    alias = router.db_for_write(model, instance=obj)
    connection = connections[alias]
    if not connection.features.can_return_columns_from_insert or not written_in_one(model):
        obj.save(force_insert=True, using=alias)
        return obj
    fields, values = _prepared(obj, connection)
    with connection.cursor() as cursor:
        cursor.execute(_insert_sql(connection, meta, fields), values)
        return _stored(obj, cursor.fetchone()[0], alias)


def _stored(obj: models.Model, pk: Any, alias: str) -> models.Model:
    """``obj`` as ``save()`` leaves a new row: its key as the database returned it, no longer adding."""
    obj.pk = obj._meta.pk.to_python(pk)
    obj._state.adding, obj._state.db = False, alias
    return obj


def written_in_one(model: type[models.Model]) -> bool:
    """Whether ``insert`` writes a row of ``model`` itself: the database assigns its key, and nothing
    listens to its saves (those keep ``save()``)."""
    return (model._meta.pk.get_default() is None and not signals.pre_save.has_listeners(model)
            and not signals.post_save.has_listeners(model))


def insert_if(obj: models.Model, gate: str, gate_params: list[Any]) -> bool:
    """Run ``gate``, a conditional write, and ``insert(obj)`` only when it wrote a row; returns whether
    it did. On PostgreSQL, for a model ``written_in_one``, both are one statement and one round trip:
    ``WITH gate AS (... RETURNING 1) INSERT ... SELECT ... FROM gate``. Elsewhere (SQLite has no
    data-modifying WITH) the gate's row count decides, then ``insert``."""
    return insert_if_later(obj, gate, gate_params).value


def insert_if_later(obj: models.Model, gate: str, gate_params: list[Any]) -> Later:
    """``insert_if``, its answer in a ``Later``: inside ``pipelined`` on PostgreSQL known when the pipeline
    ends, otherwise at once."""
    model, meta = type(obj), obj._meta
    connection = connections[router.db_for_write(model, instance=obj)]
    if connection.vendor != "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(gate, gate_params)
            wrote = cursor.rowcount > 0
        if wrote:
            insert(obj)
        return Later.known(wrote)
    if not written_in_one(model):
        def gated(row: Any) -> bool:
            if row is None:
                return False
            insert(obj)  # through save(), for its receivers (in a pipeline, once it has ended)
            return True

        return run(connection, f"{gate} RETURNING 1", gate_params, gated)
    fields, values = _prepared(obj, connection)
    insert_sql = _insert_sql(connection, meta, fields)
    head, returning = insert_sql.split(" VALUES ", 1)[0], insert_sql.rsplit(" RETURNING ", 1)[1]
    # The INSERT's own text with its VALUES row selected from the gate: one row if the gate wrote one. Names
    # from the model's _meta and the caller's statement, values as parameters.
    statement = (f"WITH gate AS ({gate} RETURNING 1) {head} SELECT {', '.join(['%s'] * len(fields))} "  # noqa: S608
                 f"FROM gate RETURNING {returning}")

    def stored(row: Any) -> bool:
        if row is None:
            return False
        _stored(obj, row[0], connection.alias)
        return True

    return run(connection, statement, [*gate_params, *values], stored)


# --- pipelines ------------------------------------------------------------------------------------

_NOT_YET = object()


class Later:
    """What a statement sent by ``run`` gave: its first row, passed through the caller's ``then``. Known
    at once, or, for a statement sent inside ``pipelined`` on PostgreSQL, once that pipeline has ended."""

    __slots__ = ("_value",)

    def __init__(self) -> None:
        self._value: Any = _NOT_YET

    @classmethod
    def known(cls, value: Any) -> Later:
        later = cls()
        later._value = value
        return later

    @property
    def ready(self) -> bool:
        return self._value is not _NOT_YET

    @property
    def value(self) -> Any:
        if self._value is _NOT_YET:
            raise RuntimeError("a pipelined statement's result is read after its pipeline ends")
        return self._value


def run(conn: Any, statement: str, params: list[Any], then: Callable[[Any], Any] | None = None) -> Later:
    """Execute ``statement`` (one that returns rows) on ``conn`` and hand its first row, or None, to
    ``then``; the ``Later`` holds what ``then`` returned (the row without one). At once, or inside
    ``pipelined`` on PostgreSQL when that pipeline ends: ``then`` must then not be needed before."""
    later = Later()
    conn = connections[conn.alias]  # the connection itself, not ``django.db.connection``'s proxy of it
    pending = conn.__dict__.get("_sql_pipeline")
    cursor = conn.cursor()
    try:
        if pending is not None:
            conn._sql_sending_later = True  # not waited for (``_waited_unless_later``)
        cursor.execute(statement, params)
    except BaseException:
        cursor.close()
        raise
    finally:
        if pending is not None:
            conn._sql_sending_later = False
    if pending is not None:
        pending.append((cursor, later, then))
        return later
    with cursor:
        row = cursor.fetchone()
    later._value = then(row) if then is not None else row
    return later


def _waited_unless_later(conn: Any, pipeline: Any, execute: Callable, sql: str, params: Any, many: bool,
                         context: dict) -> Any:
    """In a pipeline, a statement not sent by ``run`` is waited for: psycopg gives its row count only with its
    result (until then -1), and the ORM reads it at once (an update's count; ``save()`` inserts when it is 0)."""
    result = execute(sql, params, many, context)
    if not conn.__dict__.get("_sql_sending_later"):
        pipeline.sync()
    return result


@functools.cache
def _pipelines_supported() -> bool:
    import psycopg  # only where PostgreSQL is used

    return psycopg.Pipeline.is_supported()


@contextlib.contextmanager
def pipelined(using: str = DEFAULT_DB_ALIAS) -> Iterator[None]:
    """On PostgreSQL, the statements ``run`` sends in this block go to the server one after another
    without waiting for each other's results (psycopg's pipeline mode, with the transaction's BEGIN), and
    their results come back together, in one round trip, when the block ends; each statement's ``then``
    runs there, in order. Any other statement in the block (the ORM's) waits for its result, and for those
    sent before it, as always: its row count is known when it returns. The server runs them in order, and
    stops at the first that fails: that error is raised at the block's end (or at such a statement).
    Elsewhere, or inside another pipeline (whose end then reads them), this does nothing.

    Each round trip on a hot path is a wait for the database server's process to wake up; a transaction
    whose writes need nothing from one another need not pay it per statement."""
    conn = connections[using]
    if conn.vendor != "postgresql" or "_sql_pipeline" in conn.__dict__ or not _pipelines_supported():
        yield
        return
    conn.ensure_connection()
    pending: list[tuple[Any, Later, Callable[[Any], Any] | None]] = []
    conn._sql_pipeline = pending
    try:
        with conn.wrap_database_errors, conn.connection.pipeline() as pipeline, \
                conn.execute_wrapper(functools.partial(_waited_unless_later, conn, pipeline)):
            yield
        del conn._sql_pipeline
        for cursor, later, then in pending:
            row = cursor.fetchone()
            later._value = then(row) if then is not None else row
    finally:
        conn.__dict__.pop("_sql_pipeline", None)
        for cursor, _, _ in pending:
            cursor.close()


@functools.cache
def _by_columns_plan(vendor: str, model: type, columns: tuple[str, ...], also: str = "",
                     limit: int = 0) -> tuple[str, list[tuple[Any, list, Any]]]:
    qn, meta = connection.ops.quote_name, model._meta
    plan = row_plan(vendor, model)
    where = " AND ".join(f"{qn(meta.get_field(name).column)} = %s" for name in columns)
    selected = ", ".join([*(qn(field.column) for field, _, _ in plan), *([f"({also})"] if also else [])])
    # Names from the model's _meta (and the caller's written expression), values as parameters.
    sql = f"SELECT {selected} FROM {qn(meta.db_table)} WHERE {where}"  # noqa: S608
    return sql + (f" LIMIT {int(limit)}" if limit else ""), plan


@functools.cache
def row_plan(vendor: str, model: type) -> list[tuple[Any, list, Any]]:
    """Each concrete field of ``model`` with the database converters its column's value goes through, and
    that column: (field, converters, column), built once per vendor."""
    meta, plan = model._meta, []
    for field in meta.concrete_fields:
        col = field.get_col(meta.db_table)
        plan.append((field, connection.ops.get_db_converters(col) + col.get_db_converters(connection), col))
    return plan


@functools.cache
def columns_of(vendor: str, model: type, alias: str) -> str:
    """The select list of every column of ``model`` in a written query where its table is ``alias``, in
    the order ``from_row`` reads them."""
    qn = connection.ops.quote_name
    return ", ".join(f"{alias}.{qn(field.column)}" for field, _, _ in row_plan(vendor, model))


def from_row(model: type, row: Any) -> Any:
    """The object of ``model`` whose columns (``columns_of``) begin ``row``, as the ORM converts them."""
    conn = connections[DEFAULT_DB_ALIAS]  # the wrapper itself: the ``connection`` proxy looks it up per use
    return _from_row(model, row_plan(conn.vendor, model), row, conn)


def _column_values(model: type, values: dict[str, Any], conn: Any) -> list[Any]:
    meta = model._meta
    return [meta.get_field(name).get_db_prep_value(getattr(value, "pk", value), conn) for name, value in values.items()]


def _from_row(model: type, plan: list[tuple[Any, list, Any]], row: Any, conn: Any) -> Any:
    converted = []
    for value, (_field, converters, col) in zip(row[:len(plan)], plan, strict=True):
        for converter in converters:
            value = converter(value, col, conn)
        converted.append(value)
    return model.from_db(conn.alias, [field.attname for field, _, _ in plan], converted)


def one_by(model: type, **values: Any) -> Any:
    """``model.objects.filter(**values).first()`` for an equality lookup that names at most one row (a
    primary key, a unique set of columns), as one statement written out once per shape: on the hot
    paths, Django compiling such a read cost more than the database took to answer it."""
    return one_by_also(model, "", [], **values)[0]


def some_by(model: type, limit: int, **values: Any) -> list[Any]:
    """Up to ``limit`` rows of an equality lookup, in no order, as ``one_by`` reads one (e.g. two, to tell
    a name that names one row from one that names several)."""
    conn = connections[DEFAULT_DB_ALIAS]  # the wrapper itself: the ``connection`` proxy looks it up per use
    sql, plan = _by_columns_plan(conn.vendor, model, tuple(values), "", limit)
    with conn.cursor() as cursor:
        cursor.execute(sql, _column_values(model, values, conn))
        rows = cursor.fetchall()
    return [_from_row(model, plan, row, conn) for row in rows]


def one_by_also(model: type, also: str, also_params: list[Any], **values: Any) -> tuple[Any, Any]:
    """``one_by`` and, in the same statement, one more value about that row: ``also``, a written SQL
    expression (it may name the model's table, e.g. in an EXISTS) whose parameters come first. Returns
    (the object or None, the value or None)."""
    conn = connections[DEFAULT_DB_ALIAS]  # the wrapper itself: the ``connection`` proxy looks it up per use
    sql, plan = _by_columns_plan(conn.vendor, model, tuple(values), also)
    with conn.cursor() as cursor:
        cursor.execute(sql, [*also_params, *_column_values(model, values, conn)])
        row = cursor.fetchone()
    if row is None:
        return None, None
    return _from_row(model, plan, row, conn), (row[len(plan)] if also else None)


@functools.cache
def _update_sql(vendor: str, model: type, columns: tuple[str, ...], where: tuple[str, ...]) -> str:
    qn, meta = connection.ops.quote_name, model._meta
    assignments = ", ".join(f"{qn(meta.get_field(name).column)} = %s" for name in columns)
    conditions = " AND ".join(f"{qn(meta.get_field(name).column)} = %s" for name in where)
    # Names from the model's _meta, values as parameters.
    return f"UPDATE {qn(meta.db_table)} SET {assignments} WHERE {conditions}"  # noqa: S608


def update_statement(model: type, values: dict[str, Any], where: dict[str, Any]) -> tuple[str, list[Any]]:
    """The UPDATE of ``update_by`` and its parameters, for a caller that wraps it (e.g. in a WITH)."""
    meta, conn = model._meta, connections[DEFAULT_DB_ALIAS]  # the wrapper itself, looked up once
    params = [meta.get_field(name).get_db_prep_save(getattr(value, "pk", value), conn)
              for name, value in values.items()]
    return _update_sql(conn.vendor, model, tuple(values), tuple(where)), [*params, *_column_values(model, where, conn)]


def update_by(model: type, values: dict[str, Any], **where: Any) -> int:
    """``model.objects.filter(**where).update(**values)`` for plain values and equality conditions, as one
    statement written out once per shape (values prepared as ``update()`` prepares them); returns the row
    count. ``update()`` built and compiled its UPDATE anew on every call."""
    with connection.cursor() as cursor:
        cursor.execute(*update_statement(model, values, where))
        return cursor.rowcount
