"""The phone played by headless Chromium (Debian's, driven by Playwright): tapping an option on /m/
answers the hook that waits on the desk, whose stdout is asserted exactly."""

from __future__ import annotations

import pytest

from tests.e2e_support import CHROMIUM, CHROMIUM_ARGS

from .test_mobile_e2e import FEATURES, FRAMEWORK, ask, start_session, world  # noqa: F401 - world is a fixture

pytestmark = [pytest.mark.e2e, pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]



def test_tapping_options_on_the_phone_page_answers_the_waiting_hook(world, tmp_path):  # noqa: F811
    playwright_api = pytest.importorskip("playwright.sync_api")
    server, desk, session = world
    start_session(desk)
    hook = desk.hook_async(ask([FRAMEWORK, FEATURES]))
    with playwright_api.sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True,
        )
        try:
            context.add_cookies([{"name": "sessionid", "value": session.cookies["sessionid"], "url": server.url}])
            page = context.new_page()
            page.goto(f"{server.url}/m/")
            card = page.locator('[data-testid="question"]')
            card.wait_for(timeout=30_000)  # live over the socket, or by polling
            card.locator('[data-testid="option"][data-label="React"]').click()
            card.locator('[data-testid="option"][data-label="Search"]').click()
            card.locator('[data-testid="option"][data-label="Export"]').click()
            card.locator('[data-testid="submit-answer"]').click()
            output = hook.result(60)
        finally:
            context.close()
    assert output == {
        "hookSpecificOutput": {
            "hookEventName": "PreToolUse",
            "permissionDecision": "allow",
            "updatedInput": {
                "questions": [FRAMEWORK, FEATURES],
                "answers": {"Which framework?": "React", "Which features?": "Search, Export"},
            },
        }
    }
