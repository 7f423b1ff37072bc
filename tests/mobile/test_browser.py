"""Headless Chromium on the real phone page: tap an option, send, and the answer is stored and queued."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from django.conf import settings
from django.db import connection

from devices.models import OutboxItem
from mobile import services
from mobile.models import Answer, Question
from tests.e2e_support import CHROMIUM, CHROMIUM_ARGS, Daphne, wait_until
from tests.mobile.factories import TWO_QUESTIONS, ask


def in_thread(fn, **kwargs):
    def run():
        try:
            return fn(**kwargs)
        finally:
            connection.close()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(run).result(timeout=30)



@pytest.mark.e2e
@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_tapping_an_option_on_the_phone_page_answers_the_question(tmp_path, client, bridge, mobile_user):
    playwright_api = pytest.importorskip("playwright.sync_api")
    question, _nonce = ask(bridge, questions=TWO_QUESTIONS)
    late, _ = ask(bridge, tool_use_id="toolu_02")
    client.force_login(mobile_user)
    session_key = client.cookies["sessionid"].value
    server = Daphne(tmp_path)
    try:
        with playwright_api.sync_playwright() as playwright:
            context = playwright.chromium.launch_persistent_context(
                str(tmp_path / "profile"), executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
                viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True,
            )
            try:
                context.add_cookies([{"name": "sessionid", "value": session_key, "url": server.url}])
                page = context.new_page()
                page.goto(f"{server.url}/m/")
                card = page.locator(f'[data-testid="question"][data-question-id="{question.pk}"]')
                card.wait_for(timeout=15_000)
                # The socket comes up (live), the headers and descriptions are shown.
                page.locator('[data-testid="live-state"]', has_text="live").wait_for(timeout=15_000)
                assert "Framework" in card.text_content() and "Progressive" in card.text_content()
                card.locator('[data-testid="option"][data-label="Vue"]').click()
                checks = card.locator('[data-testid="option"][data-question="Which checks should run?"]')
                checks.filter(has_text="Lint").click()
                checks.filter(has_text="Tests").click()
                assert card.locator('[data-testid="option"][data-label="Tests"]').get_attribute("aria-pressed") == "true"
                card.locator('[data-testid="other"][data-question="Which framework?"]').fill("with Pinia")
                card.locator('[data-testid="submit-answer"]').click()
                card.locator('[data-testid="question-state"]', has_text="Answered").wait_for(timeout=15_000)

                # Someone answered the other question at the desk first: the phone says so plainly.
                # (Playwright's sync API runs an event loop here, so the ORM call goes to a thread.)
                in_thread(services.desktop_answer_record, device=bridge, session_id="sess-1",
                          question_id=str(late.pk), answers={"Which framework?": "React"})
                late_card = page.locator(f'[data-testid="question"][data-question-id="{late.pk}"]')
                if not settings.REDIS_URL:
                    # The in-memory layer is per process, so this test process's event cannot reach
                    # daphne's socket: the late answer's named refusal tells the page instead.
                    late_card.locator('[data-testid="option"][data-label="Vue"]').click()
                    late_card.locator('[data-testid="submit-answer"]').click()
                # (With Redis the event arrives live over /ws/mobile and the card turns on its own.)
                late_card.locator('[data-testid="question-state"]', has_text="Answered on the desktop").wait_for(
                    timeout=15_000)
            finally:
                context.close()
    finally:
        server.stop()

    answer = wait_until(lambda: Answer.objects.filter(question=question).first(), timeout=10, message="the answer")
    assert answer.via == "phone" and answer.actor_id == mobile_user.pk
    assert answer.answers == {"Which framework?": ["Vue"], "Which checks should run?": ["Lint", "Tests"]}
    assert answer.other == {"Which framework?": "with Pinia"}
    assert Question.objects.get(pk=question.pk).state == "answered"
    assert Answer.objects.get(question=late).via == "desktop"
    item = OutboxItem.objects.get(device=bridge, kind="mobile.answer")
    assert item.payload["question_id"] == str(question.pk)
    assert item.payload["answers"] == answer.answers and item.payload["other"] == answer.other
