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
