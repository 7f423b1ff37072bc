"""Headless Chromium on /m/: a paced message says plainly that it waits, and its place in line; a message
that cannot reach the platform says so and can be sent again."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import connection

from mobile.models import PhoneMessage
from tests.e2e_support import Daphne
from tests.mobile.factories import ask
from tests.mobile.test_browser import CHROMIUM, CHROMIUM_ARGS


def wait_for_line(card, text: str, server: Daphne) -> None:
    """The card's log shows a line with ``text``; if not, fail saying what the page, its API calls, the
    database's lock holders and daphne said."""
    try:
        # Longer than a SQLite writer's busy timeout (30 s): a write that waits on a lock ends in the page's
        # error note, which this then shows, rather than in an arbitrary cut-off.
        card.locator(".m-log li", has_text=text).wait_for(timeout=35_000)
    except Exception as exc:
        note = card.locator('[data-testid="session-note"]').text_content()
        lines = card.locator(".m-log li").all_text_contents()
        calls = "\n".join(getattr(card.page, "api_calls", []))
        raise AssertionError(f"no line for {text!r}: note {note!r}, lines {lines!r}\n"
                             f"the page's API calls:\n{calls}\nlocks on the database file: {sqlite_locks()}\n"
                             f"daphne log:\n{server.log()[-4000:]}") from exc


def sqlite_locks() -> list[str]:
    """Who holds POSIX locks on the SQLite test database and its -shm (/proc/locks; in WAL mode the writer
    holds byte 120 of -shm): a writer waits up to its 30 s busy timeout for the one before it."""
    name = str(connection.settings_dict["NAME"])
    if connection.vendor != "sqlite":
        return []
    files = {os.stat(path).st_ino: label for path, label in ((name, "db"), (name + "-shm", "shm")) if os.path.exists(path)}
    held = []
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        inode = fields[5].rsplit(":", 1)[-1] if len(fields) > 7 else ""
        if inode.isdigit() and int(inode) in files:
            pid = fields[4]
            try:
                command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:160]
            except OSError:
                command = "?"
            held.append(f"{files[int(inode)]} {fields[3]} {fields[6]}-{fields[7]} pid {pid}: {command}")
    return held


@contextlib.contextmanager
def session_card(tmp_path, client, bridge, mobile_user) -> Iterator[tuple]:
    """/m/ in Chromium on a daphne, logged in as ``mobile_user``, with the card of one agent session."""
    playwright_api = pytest.importorskip("playwright.sync_api")
    ask(bridge)
    client.force_login(mobile_user)
    session_key = client.cookies["sessionid"].value
    server = Daphne(tmp_path, AI1NET_MESSAGE_RATE="1", AI1NET_MESSAGE_RATE_WINDOW_SEC="3600")
    try:
        with playwright_api.sync_playwright() as playwright:
            context = playwright.chromium.launch_persistent_context(
                str(tmp_path / "profile"), executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
                viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True,
            )
            try:
                context.add_cookies([{"name": "sessionid", "value": session_key, "url": server.url}])
                page = context.new_page()
                # What the page asked the API and what came back, for a failure to tell.
                page.api_calls = []
                page.on("request", lambda r: "/api/" in r.url and page.api_calls.append(f"-> {r.method} {r.url}"))
                page.on("response", lambda r: "/api/" in r.url and page.api_calls.append(f"<- {r.status} {r.url}"))
                page.on("requestfailed", lambda r: "/api/" in r.url and page.api_calls.append(
                    f"!! {r.method} {r.url}: {r.failure}"))
                page.goto(f"{server.url}/m/")
                card = page.locator('[data-testid="session"][data-session-id="sess-1"]')
                card.wait_for(timeout=15_000)
                yield page, card, server
            finally:
                context.close()
    finally:
        server.stop()


@pytest.mark.e2e
@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_phone_shows_a_waiting_message_with_its_place(tmp_path, client, bridge, mobile_user):
    with session_card(tmp_path, client, bridge, mobile_user) as (page, card, server):
        for text in ("first", "second", "third"):
            card.locator('[data-testid="message-text"]').fill(text)
            card.locator('[data-testid="send-message"]').click()
            wait_for_line(card, text, server)
        log = card.locator(".m-log")
        assert log.locator("li", has_text="first").text_content() == "Sent: first"
        assert log.locator("li", has_text="second").text_content().startswith("Waiting, 1 in line")
        assert log.locator("li", has_text="third").text_content().startswith("Waiting, 2 in line")
        # A fresh load shows the same line from /api/mobile/state.
        page.reload()
        card.locator(".m-log li", has_text="third").wait_for(timeout=15_000)
        assert card.locator(".m-log li", has_text="third").text_content().startswith("Waiting, 2 in line")
    assert list(PhoneMessage.objects.order_by("created_at").values_list("state", flat=True)) == [
        "queued", "waiting", "waiting"]


@pytest.mark.e2e
@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_a_message_that_cannot_reach_the_platform_says_so_and_can_be_sent_again(tmp_path, client, bridge,
                                                                                 mobile_user):
    with session_card(tmp_path, client, bridge, mobile_user) as (page, card, server):
        page.route("**/messages", lambda route: route.abort("connectionreset"))
        card.locator('[data-testid="message-text"]').fill("lost")
        send = card.locator('[data-testid="send-message"]')
        send.click()
        note = card.locator('[data-testid="session-note"]')
        note.filter(has_text="No connection").wait_for(timeout=15_000)
        assert send.is_enabled() and card.locator('[data-testid="message-text"]').input_value() == "lost"
        page.unroute("**/messages")
        send.click()  # the same text, now through
        wait_for_line(card, "lost", server)
    assert list(PhoneMessage.objects.values_list("text", flat=True)) == ["lost"]


@pytest.mark.e2e
@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_a_card_update_leaves_the_message_being_typed_and_a_tap_under_way_alone(tmp_path, client, bridge,
                                                                                 mobile_user):
    # An event re-renders the session cards. Moving a card that is already in place blurred the text being
    # typed (a phone closes its keyboard) and, between a tap's press and release, lost the tap: CI saw the
    # first Send after the page's socket snapshot do nothing.
    with session_card(tmp_path, client, bridge, mobile_user) as (page, card, server):
        page.locator('[data-testid="live-state"]', has_text="live").wait_for(timeout=15_000)
        text = card.locator('[data-testid="message-text"]')
        text.fill("half a thought")
        text.focus()
        status = page.evaluate("""() => fetch('/api/mobile/sessions/sess-1/keep_going', {
            method: 'POST', credentials: 'same-origin',
            headers: {'Content-Type': 'application/json', 'Accept': 'application/json',
                      'X-CSRFToken': document.cookie.match(/csrftoken=([^;]+)/)[1]},
            body: JSON.stringify({enabled: true})}).then(r => r.status)""")
        assert status == 200
        # The switch shows the session's update: the page has rendered the event.
        page.wait_for_function(
            "() => document.querySelector('[data-session-id=\"sess-1\"] [data-testid=keep-going]').checked",
            timeout=15_000)
        assert page.evaluate("() => document.activeElement.getAttribute('data-testid')") == "message-text"
        assert text.input_value() == "half a thought"
