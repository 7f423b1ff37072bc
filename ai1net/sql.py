"""Statements written once per model and database vendor, for rows read and written on every hot request.

Django's ``Model.save()`` builds and compiles its INSERT anew on every call: on an answer POST the two
ORM inserts (the answer, its room message) were 18% of the request thread in a py-spy profile of
daphne, more than the statements themselves.
"""

from __future__ import annotations

import functools
from typing import Any

from django.db import connection, connections, models, router
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
    fields = [field for field in meta.concrete_fields if not field.primary_key]
    values = [field.get_db_prep_save(field.pre_save(obj, True), connection) for field in fields]
    with connection.cursor() as cursor:
        cursor.execute(_insert_sql(connection, meta, fields), values)
        obj.pk = meta.pk.to_python(cursor.fetchone()[0])
    obj._state.adding, obj._state.db = False, alias
    return obj


def written_in_one(model: type[models.Model]) -> bool:
    """Whether ``insert`` writes a row of ``model`` itself: the database assigns its key, and nothing
    listens to its saves (those keep ``save()``)."""
    return (model._meta.pk.get_default() is None and not signals.pre_save.has_listeners(model)
            and not signals.post_save.has_listeners(model))


def insert_after(obj: models.Model, gate: str, gate_params: list[Any]) -> bool:
    """``insert(obj)`` in the statement of ``gate``, a data-modifying statement with RETURNING, and only
    when it returned a row: ``WITH gate AS (...) INSERT ... SELECT ... FROM gate``. A conditional write
    and the row it entitles in one round trip. PostgreSQL only (SQLite has no data-modifying WITH), for
    a model ``written_in_one``; returns whether the row went in."""
    model, meta = type(obj), obj._meta
    connection = connections[router.db_for_write(model, instance=obj)]
    assert connection.vendor == "postgresql" and written_in_one(model), (connection.vendor, model)
    fields = [field for field in meta.concrete_fields if not field.primary_key]
    values = [field.get_db_prep_save(field.pre_save(obj, True), connection) for field in fields]
    insert_sql = _insert_sql(connection, meta, fields)
    head, returning = insert_sql.split(" VALUES ", 1)[0], insert_sql.rsplit(" RETURNING ", 1)[1]
    # The INSERT's own text with its VALUES row selected from the gate: one row if the gate wrote one. Names
    # from the model's _meta and the caller's statement, values as parameters.
    statement = (f"WITH gate AS ({gate}) {head} SELECT {', '.join(['%s'] * len(fields))} FROM gate "  # noqa: S608
                 f"RETURNING {returning}")
    with connection.cursor() as cursor:
        cursor.execute(statement, [*gate_params, *values])
        row = cursor.fetchone()
    if row is None:
        return False
    obj.pk = meta.pk.to_python(row[0])
    obj._state.adding, obj._state.db = False, connection.alias
    return True


@functools.cache
def _by_columns_plan(vendor: str, model: type, columns: tuple[str, ...]) -> tuple[str, list[tuple[Any, list, Any]]]:
    qn, meta = connection.ops.quote_name, model._meta
    plan = []
    for field in meta.concrete_fields:
        col = field.get_col(meta.db_table)
        plan.append((field, connection.ops.get_db_converters(col) + col.get_db_converters(connection), col))
    where = " AND ".join(f"{qn(meta.get_field(name).column)} = %s" for name in columns)
    # Names from the model's _meta, values as parameters.
    sql = (f"SELECT {', '.join(qn(field.column) for field, _, _ in plan)} FROM {qn(meta.db_table)} "  # noqa: S608
           f"WHERE {where}")
    return sql, plan


def one_by(model: type, **values: Any) -> Any:
    """``model.objects.filter(**values).first()`` for an equality lookup that names at most one row (a
    primary key, a unique set of columns), as one statement written out once per shape: on the hot
    paths, Django compiling such a read cost more than the database took to answer it."""
    names = tuple(values)
    sql, plan = _by_columns_plan(connection.vendor, model, names)
    meta = model._meta
    params = [meta.get_field(name).get_db_prep_value(getattr(value, "pk", value), connection)
              for name, value in values.items()]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    if row is None:
        return None
    converted = []
    for value, (_field, converters, col) in zip(row, plan, strict=True):
        for converter in converters:
            value = converter(value, col, connection)
        converted.append(value)
    return model.from_db(connection.alias, [field.attname for field, _, _ in plan], converted)
