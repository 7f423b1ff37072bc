"""ai1net.sql.insert: Model.save(force_insert=True) as one statement written once per model and vendor."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.models import signals
from django.db.models.sql.compiler import SQLInsertCompiler
from django.test.utils import CaptureQueriesContext

from ai1net import sql
from im.models import Message, Room
from mobile.models import Answer
from tests.mobile.factories import ask

pytestmark = pytest.mark.django_db


def test_a_row_inserted_in_one_statement_reads_back_as_the_orm_writes_it(bridge, mobile_user):
    question, _ = ask(bridge)
    other_question, _ = ask(bridge, tool_use_id="toolu_02")  # one answer per question
    room = Room.objects.get(pk=question.room_id)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(SQLInsertCompiler, "execute_sql", lambda *a, **k: pytest.fail("an ORM insert"))
        with CaptureQueriesContext(connection) as queries:
            mine = sql.insert(Answer(question=question, actor=mobile_user, via=Answer.Via.PHONE,
                                     answers={"Which framework?": ["Vue"]}, other={"x": "ü"}))
            message = sql.insert(Message(room=room, seq=10_000, author_user=mobile_user, kind=Message.Kind.TEXT,
                                         body={"text": "hi"}))
    assert len(queries) == 2
    orms = Answer.objects.create(question=other_question, actor=mobile_user, via=Answer.Via.PHONE,
                                 answers={"Which framework?": ["Vue"]}, other={"x": "ü"})
    assert mine.pk and mine.pk != orms.pk and not mine._state.adding and mine._state.db == "default"
    assert mine.created_at is not None  # auto_now_add ran, as save() runs it
    read, orm_read = Answer.objects.get(pk=mine.pk), Answer.objects.get(pk=orms.pk)
    for field in Answer._meta.concrete_fields:
        if field.name not in ("id", "created_at", "question"):
            assert getattr(read, field.attname) == getattr(orm_read, field.attname), field.name
    assert read.created_at == mine.created_at
    assert Message.objects.get(pk=message.pk).body == {"text": "hi"} and message.seq == 10_000


def test_a_model_with_save_receivers_keeps_save(bridge, mobile_user):
    question, _ = ask(bridge)
    seen = []

    def receiver(sender, instance, created, **kwargs):
        seen.append((instance.pk, created))

    signals.post_save.connect(receiver, sender=Answer, dispatch_uid="test-sql-insert")
    try:
        answer = sql.insert(Answer(question=question, actor=mobile_user, via=Answer.Via.PHONE, answers={}))
    finally:
        signals.post_save.disconnect(dispatch_uid="test-sql-insert", sender=Answer)
    assert seen == [(answer.pk, True)]


def test_insert_if_writes_the_row_only_when_its_gate_wrote_one_in_one_statement_on_postgresql(bridge, mobile_user):
    from mobile.models import Question

    question, _ = ask(bridge)
    qn = connection.ops.quote_name
    gate = (f"UPDATE {qn(Question._meta.db_table)} SET {qn('state')} = %s "  # noqa: S608 - names from _meta
            f"WHERE {qn('id')} = %s AND {qn('state')} = %s")
    params = [Question.State.ANSWERED.value, Question._meta.pk.get_db_prep_value(question.pk, connection),
              Question.State.PENDING.value]
    with CaptureQueriesContext(connection) as queries:
        first = Answer(question=question, actor=mobile_user, via=Answer.Via.PHONE, answers={"a": ["b"]})
        assert sql.insert_if(first, gate, params) is True
    # PostgreSQL: the gate and the INSERT in one statement; SQLite: the gate, then the INSERT.
    assert len(queries) == (1 if connection.vendor == "postgresql" else 2)
    assert first.pk and not first._state.adding
    stored = Answer.objects.get(pk=first.pk)
    assert (stored.question_id, stored.actor_id, stored.answers, stored.other) == (question.pk, mobile_user.pk,
                                                                                   {"a": ["b"]}, {})
    assert stored.created_at == first.created_at
    assert Question.objects.get(pk=question.pk).state == Question.State.ANSWERED
    second = Answer(question=question, actor=mobile_user, via=Answer.Via.PHONE, answers={})
    with CaptureQueriesContext(connection) as queries:
        assert sql.insert_if(second, gate, params) is False  # the gate changed no row: nothing written
    assert len(queries) == 1
    assert second.pk is None and Answer.objects.filter(question=question).count() == 1


def test_an_answer_with_save_receivers_is_still_written_by_its_burn_s_winner(phone, bridge):
    """With something listening to Answer's saves, the answer goes through save() after the burn, on
    either database: the one-statement form is only for rows nothing listens to."""
    from tests.mobile.test_answer import answer

    question, nonce = ask(bridge)
    saved = []
    signals.post_save.connect(lambda sender, instance, created, **kw: saved.append(instance.question_id),
                              sender=Answer, dispatch_uid="test-burn-receivers", weak=False)
    try:
        assert not sql.written_in_one(Answer)
        assert answer(phone, question, nonce).status_code == 200
        assert answer(phone, question, nonce).status_code == 409  # the burn still decides
    finally:
        signals.post_save.disconnect(dispatch_uid="test-burn-receivers", sender=Answer)
    assert saved == [question.pk] and Answer.objects.filter(question=question).count() == 1
    assert sql.written_in_one(Answer)
