"""Headless Chromium on the real Studio page with a real probe: a write an agent asked for shows its
diff before approval; the owner clicks Approve and the file changes, once."""

from __future__ import annotations

import pytest

from devices import services as device_services
from probes.models import ProbeCommand
from tests.e2e_support import CHROMIUM, CHROMIUM_ARGS, Daphne, wait_until
from tests.probes_platform.test_e2e_probe import agent, command, start_probe


@pytest.mark.e2e
@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_approving_a_write_in_studio(tmp_path, client, user):
    playwright_api = pytest.importorskip("playwright.sync_api")
    root = tmp_path / "proj"
    root.mkdir()
    target = root / "notes.txt"
    target.write_text("alpha\nbeta\n")
    client.force_login(user)
    session_key = client.cookies["sessionid"].value
    server = Daphne(tmp_path)
    device, token = device_services.device_create(owner=user, name="desk", kind="probe", ephemeral=True)
    probe = start_probe(server, device, token, root, tmp_path, "--write")
    http = agent(server, user)
    try:
        with playwright_api.sync_playwright() as playwright:
            context = playwright.chromium.launch_persistent_context(
                str(tmp_path / "profile"), executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
            )
            try:
                context.add_cookies([{"name": "sessionid", "value": session_key, "url": server.url}])
                page = context.new_page()
                page.goto(f"{server.url}/studio/?probe={device.pk}")
                page.locator("#probe-info", has_text="online").wait_for(timeout=30_000)

                asked = command(http, "desk", "write", {"path": str(target), "content": "alpha\ngamma\n"}, wait=0)
                assert asked.status_code == 202
                card = page.locator(f'#approvals [data-command-id="{asked.json()["id"]}"]')
                card.locator('[data-testid="diff"] .add', has_text="+gamma").wait_for(timeout=30_000)
                assert card.locator('[data-testid="diff"] .del', has_text="-beta").count() == 1
                assert target.read_text() == "alpha\nbeta\n"  # shown, not yet written

                card.locator('[data-testid="approve"]').click()
                page.locator(f'#commands [data-command-id="{asked.json()["id"]}"][data-state="done"]').wait_for(
                    timeout=30_000)
                # The conversation (the probe's Studio room) shows the approval and the result.
                page.locator("#conversation", has_text="approved by alice").wait_for(timeout=30_000)
                page.locator("#approvals", has_text="Nothing waits for you.").wait_for(timeout=30_000)
            finally:
                context.close()
        assert target.read_text() == "alpha\ngamma\n"
        wait_until(lambda: ProbeCommand.objects.get(pk=asked.json()["id"]).state == "done", 10)
        assert ProbeCommand.objects.get(pk=asked.json()["id"]).via == "api"
    finally:
        http.close()
        probe.stop()
        server.stop()
