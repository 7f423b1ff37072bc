"""Pending probe approvals are reachable from the phone page: shown with their diff, decided there."""

from __future__ import annotations

import pytest

from devices import services as device_services
from devices.models import Device
from probes import services
from probes.models import ProbeCommand
from tests.e2e_support import Daphne, wait_until
from tests.probes_platform.test_browser_studio import CHROMIUM, CHROMIUM_ARGS

DIFF = "--- a/notes.txt\n+++ b/notes.txt\n@@ -1,2 +1,2 @@\n alpha\n-beta\n+gamma\n"


@pytest.mark.e2e
@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_a_pending_write_is_shown_and_skipped_from_the_phone(tmp_path, client, user):
    playwright_api = pytest.importorskip("playwright.sync_api")
    user.mobile_reply_enabled = True
    user.save(update_fields=["mobile_reply_enabled"])
    client.force_login(user)
    session_key = client.cookies["sessionid"].value
    device, _token = device_services.device_create(owner=user, name="desk", kind="probe", ephemeral=True)
    Device.objects.filter(pk=device.pk).update(capabilities=["read", "write"])
    device.refresh_from_db()
    command = services.command_create(user=user, device=device, op="write", args={"path": "/srv/notes.txt", "diff": DIFF})
    assert command.state == ProbeCommand.State.AWAITING_APPROVAL
    server = Daphne(tmp_path)
    try:
        with playwright_api.sync_playwright() as playwright:
            context = playwright.chromium.launch_persistent_context(
                str(tmp_path / "profile"), executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
                viewport={"width": 390, "height": 844},
            )
            try:
                context.add_cookies([{"name": "sessionid", "value": session_key, "url": server.url}])
                page = context.new_page()
                page.goto(f"{server.url}/m/")
                card = page.locator(f'[data-testid="probe-approval"][data-id="{command.pk}"]')
                card.locator("pre .ok", has_text="+gamma").wait_for(timeout=20_000)
                assert card.locator("pre .bad", has_text="-beta").count() == 1
                card.locator('[data-testid="phone-skip"]').click()
                page.locator('[data-testid="probe-approvals"]').wait_for(state="hidden", timeout=20_000)
            finally:
                context.close()
        # (The ORM is not usable inside Playwright's sync context: check the gateway afterwards.)
        wait_until(lambda: ProbeCommand.objects.get(pk=command.pk).state == ProbeCommand.State.REJECTED,
                   timeout=20, message="the phone's Skip to reach the gateway")
    finally:
        server.stop()
