"""Headless Chromium on the real phone page: a tool-permission request shows its diff as text (markup in
the input stays text), and tapping Deny with a reason sends the decision bound to the input's hash."""

from __future__ import annotations

import uuid

import pytest

from clients import permission
from devices.rpc import dispatch
from mobile import services
from tests.e2e_support import CHROMIUM, CHROMIUM_ARGS, Daphne
from tests.mobile.factories import outbox

EDIT = {"file_path": "/srv/app/page.html", "old_string": "<p>old</p>\n",
        "new_string": '<img src=x onerror="window.__pwned=1">\n'}


@pytest.mark.e2e
@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_permission_request_is_shown_as_text_and_denied_with_a_reason(tmp_path, client, bridge, mobile_user):
    playwright_api = pytest.importorskip("playwright.sync_api")
    services.session_start(device=bridge, session_id="sess-1", cwd="/srv/app")
    qid = str(uuid.uuid4())
    created = dispatch(bridge, str(uuid.uuid4()), "mobile.permission", {
        "question_id": qid, "session_id": "sess-1", "tool_name": "Edit", "tool_input": EDIT,
        "input_hash": permission.input_hash(EDIT), "window_sec": 300})
    assert created["result"]["state"] == "pending", created
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
                card = page.locator(f'[data-testid="question"][data-question-id="{qid}"]')
                card.wait_for(timeout=15_000)
                assert card.locator('[data-testid="tool-name"]').text_content() == "Edit"
                shown = card.locator('[data-testid="rendering"]').text_content()
                assert '+<img src=x onerror="window.__pwned=1">' in shown and "-<p>old</p>" in shown
                assert card.locator("img").count() == 0 and card.locator("p", has_text="old").count() == 0
                assert page.evaluate("() => window.__pwned") is None
                options = card.locator('[data-testid="option"]')
                assert [options.nth(i).get_attribute("data-label") for i in range(options.count())] == list(
                    permission.OPTIONS)
                card.locator(f'[data-testid="option"][data-label="{permission.DENY}"]').click()
                card.locator('[data-testid="other"]').fill("keep the paragraph")
                card.locator('[data-testid="submit-answer"]').click()
                card.locator('[data-testid="question-state"]', has_text="Answered").wait_for(timeout=15_000)
            finally:
                context.close()
    finally:
        server.stop()
    [item] = [entry.payload for entry in outbox(bridge, "mobile.answer")]
    assert item["decision"] == "deny" and item["input_hash"] == permission.input_hash(EDIT)
    assert item["other"] == {permission.question_text("Edit"): "keep the paragraph"}
