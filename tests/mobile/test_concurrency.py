"""Many phones submit at once: the nonce's conditional UPDATE lets exactly one win (SQLite and PostgreSQL)."""

import threading

import pytest
from django.db import connection

from ai1net.exceptions import ApplicationError
from mobile import services
from mobile.models import Answer, Question
from tests.mobile.factories import TWO_QUESTIONS, ask, outbox

SUBMITTERS = 8


@pytest.mark.django_db(transaction=True)
def test_exactly_one_of_many_concurrent_submits_wins(bridge, mobile_user):
    question, nonce = ask(bridge, questions=TWO_QUESTIONS)
    barrier = threading.Barrier(SUBMITTERS)
    outcomes: list[str] = []
    lock = threading.Lock()

    def submit(i: int) -> None:
        labels = ["React"] if i % 2 else ["Vue"]
        try:
            barrier.wait(timeout=10)
            services.answer_submit(actor=mobile_user, question_id=str(question.pk), nonce=nonce,
                                   answers={"Which framework?": labels, "Which checks should run?": ["Lint"]})
            result = "won"
        except ApplicationError as exc:
            result = exc.code
        except Exception as exc:  # anything else is a defect the assertion below reports
            result = f"crash: {exc!r}"
        finally:
            connection.close()
        with lock:
            outcomes.append(result)

    threads = [threading.Thread(target=submit, args=(i,)) for i in range(SUBMITTERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(outcomes) == sorted(["won"] + ["already_answered"] * (SUBMITTERS - 1)), outcomes
    assert Question.objects.get(pk=question.pk).state == "answered"
    assert Answer.objects.filter(question=question).count() == 1
    assert len(outbox(bridge, "mobile.answer")) == 1


@pytest.mark.django_db(transaction=True)
def test_questions_and_answers_at_once_keep_the_audit_chain_verifiable(bridge, mobile_user):
    """Answers and new questions of several sessions in parallel: each audits inside its own larger
    transaction (no savepoint of its own), the chain's lock serialises the appends, nothing forks."""
    import uuid

    from ai1net.accounts import selectors as accounts_selectors
    from ai1net.accounts.models import AuditEntry

    asked = [ask(bridge, session_id=f"sess-{i}", tool_use_id=f"toolu_{i}") for i in range(4)]
    before = AuditEntry.objects.count()
    barrier = threading.Barrier(8)
    errors: list[str] = []

    def answer(i: int) -> None:
        question, nonce = asked[i]
        try:
            barrier.wait(timeout=10)
            services.answer_submit(actor=mobile_user, question_id=str(question.pk), nonce=nonce,
                                   answers={"Which framework?": ["React"]})
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(repr(exc))
        finally:
            connection.close()

    def create(i: int) -> None:
        try:
            barrier.wait(timeout=10)
            services.question_create(device=bridge, question_id=str(uuid.uuid4()), session_id=f"sess-{i}",
                                     questions=TWO_QUESTIONS, window_sec=60, tool_use_id=f"toolu_new_{i}")
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(repr(exc))
        finally:
            connection.close()

    threads = [threading.Thread(target=answer, args=(i,)) for i in range(4)]
    threads += [threading.Thread(target=create, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    assert AuditEntry.objects.count() == before + 8
    assert accounts_selectors.audit_chain_verify() == (before + 8, None)
    assert Answer.objects.count() == 4
    assert len(outbox(bridge, "mobile.answer")) == 4
    seqs = [item.seq for item in outbox(bridge)]
    assert seqs == sorted(set(seqs))  # one seq each, no gap reused
