"""ai1net.sql.pipelined: statements sent together, their results read at the block's end (PostgreSQL)."""

from __future__ import annotations

import pytest
from django.db import DataError, connection, transaction

from ai1net import sql
from ai1net.accounts.models import AuditEntry
from devices.models import Device
from im.models import Message, Room
from tests.mobile.factories import ask, outbox
from tests.mobile.test_answer import answer

pytestmark = pytest.mark.django_db

on_postgresql = pytest.mark.skipif(connection.vendor != "postgresql", reason="pipelines are PostgreSQL's")


def test_a_pipeline_hands_each_statement_s_row_to_its_then_in_order_at_its_end():
    seen: list[int] = []
    with transaction.atomic(), sql.pipelined():
        first = sql.run(connection, "SELECT 1", [], lambda row: seen.append(row[0]) or "one")
        second = sql.run(connection, "SELECT 2 WHERE 1 = %s", [0], lambda row: seen.append(row) or "none")
        if connection.vendor == "postgresql":
            assert not first.ready and not second.ready and seen == []  # sent, not waited for
            with pytest.raises(RuntimeError, match="after its pipeline ends"):
                first.value  # noqa: B018
        else:
            assert seen == [1, None]  # nothing to pipeline: at once
    assert seen == [1, None] and first.value == "one" and second.value == "none"


@on_postgresql
def test_a_failing_statement_stops_the_rest_and_fails_at_the_block_s_end_as_django_s_error():
    later: list[str] = []
    with pytest.raises(DataError), transaction.atomic(), sql.pipelined():
        sql.run(connection, "SELECT 1 / %s", [0], lambda row: later.append("first"))
        sql.run(connection, "SELECT 2", [], lambda row: later.append("second"))
    assert later == []
    assert sql.run(connection, "SELECT 3", []).value == (3,)  # the connection is usable again


def test_the_orm_s_writes_in_a_pipeline_see_their_row_counts(bridge):
    """psycopg gives a pipelined statement's row count only with its result: a statement not sent by
    ``sql.run`` is waited for, so ``update()`` counts and ``save()`` updates rather than inserting."""
    with transaction.atomic(), sql.pipelined():
        later = sql.run(connection, "SELECT 1", [])
        assert Device.objects.filter(pk=bridge.pk).update(name="renamed") == 1
        bridge.name = "saved"
        bridge.save(update_fields=["name"])
        room = Room.objects.create(kind=Room.Kind.DIRECT, owner=bridge.owner, device=bridge, title="t")
        room.title = "again"
        room.save()  # an update of an existing row, not a second INSERT
    assert later.value == (1,)
    assert Device.objects.get(pk=bridge.pk).name == "saved"
    assert Room.objects.get(pk=room.pk).title == "again"


@on_postgresql
def test_an_answer_s_writes_go_to_the_server_in_one_pipeline(phone, bridge):
    question, nonce = ask(bridge)
    statuses = []

    def record(execute, statement, params, many, context):
        statuses.append((statement.split("(", 1)[0], connection.connection.pgconn.pipeline_status))
        return execute(statement, params, many, context)

    with connection.execute_wrapper(record):
        assert answer(phone, question, nonce).status_code == 200
    piped = [statement for statement, status in statuses if status]  # pq.PipelineStatus.ON is 1
    assert len(piped) == 4, statuses  # the burn with the answer, the outbox item, the room message, the audit
    assert all(status == 0 for _, status in statuses if _ not in piped)


def test_a_lost_burn_leaves_none_of_the_answer_s_writes(phone, bridge, mobile_user):
    """On PostgreSQL the writes go out before the burn is known to have won: a lost burn rolls them back."""
    question, nonce = ask(bridge)
    assert answer(phone, question, nonce).status_code == 200
    device_seq = Device.objects.get(pk=bridge.pk).next_seq
    room_seq = Room.objects.get(pk=question.room_id).next_seq
    audited = AuditEntry.objects.filter(action="mobile.answer").count()

    refused = answer(phone, question, nonce, answers={"Which framework?": ["React"]})
    assert refused.status_code == 409 and refused.json()["error"] == "already_answered"
    assert len(outbox(bridge, "mobile.answer")) == 1
    assert Message.objects.filter(room_id=question.room_id, kind=Message.Kind.ANSWER).count() == 1
    assert Device.objects.get(pk=bridge.pk).next_seq == device_seq
    assert Room.objects.get(pk=question.room_id).next_seq == room_seq
    assert AuditEntry.objects.filter(action="mobile.answer").count() == audited
    assert AuditEntry.objects.filter(action="mobile.answer_refused").count() == 1
    question.refresh_from_db()
    assert question.state == question.State.ANSWERED
