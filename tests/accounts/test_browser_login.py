"""Headless Chromium at phone size: the real login with its two-factor step, on a real daphne."""

from __future__ import annotations

import pytest
from django_otp.plugins.otp_totp.models import TOTPDevice

from ai1net.accounts.models import AuditEntry
from tests.e2e_support import CHROMIUM, CHROMIUM_ARGS, Daphne, wait_until

from .helpers import totp_code


def _fits_phone(page) -> bool:
    return page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")


@pytest.mark.e2e
@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_phone_login_with_two_factor_then_switch_on_mobile_reply(tmp_path, user, password):
    playwright_api = pytest.importorskip("playwright.sync_api")
    device = TOTPDevice.objects.create(user=user, name="app", confirmed=True)
    server = Daphne(tmp_path)
    try:
        with playwright_api.sync_playwright() as playwright:
            context = playwright.chromium.launch_persistent_context(
                str(tmp_path / "profile"), executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
                viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True,
            )
            try:
                page = context.new_page()
                page.goto(f"{server.url}/accounts/")
                page.wait_for_url("**/accounts/login/**")
                assert _fits_phone(page)
                page.fill("#id_username", "alice")
                page.fill("#id_password", password)
                page.click("button[type=submit]")
                page.wait_for_url("**/accounts/login/code/**")
                assert _fits_phone(page)
                page.fill("#id_code", totp_code(device))
                page.click("button[type=submit]")
                page.wait_for_url(f"{server.url}/accounts/")
                assert "Verified with two-factor" in page.text_content("body")
                assert _fits_phone(page)
                page.locator("#mobile-reply button", has_text="Turn on").click()
                page.locator("#mobile-reply button", has_text="Turn off").wait_for(timeout=10_000)
            finally:
                context.close()
    finally:
        server.stop()

    user.refresh_from_db()
    assert user.mobile_reply_enabled
    entry = wait_until(lambda: AuditEntry.objects.filter(action="accounts.switch.mobile_reply").first(),
                       message="the audit entry")
    assert entry.actor_id == user.pk and entry.ip == "127.0.0.1"
