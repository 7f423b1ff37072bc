"""Mobile reply over the HTTP long-poll fallback: daphne refuses the WebSocket (as a proxy that
blocks upgrades would), the bridge falls back by itself, the round trip works; once the WebSocket
opens again the bridge switches back."""

from __future__ import annotations

import pytest

from devices.models import LONGPOLL_PREFIX, Device
from mobile.models import PhoneMessage, Question
from tests.bridge.test_mobile_e2e import FAST, FRAMEWORK, Desk, answer, ask, csrf, pending, phone, start_session
from tests.e2e_support import Daphne, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def _device(desk: Desk) -> Device:
    return Device.objects.get(pk=desk.device_id)


def test_round_trip_with_the_websocket_refused_then_back_to_the_websocket(tmp_path, user, password, monkeypatch):
    user.mobile_reply_enabled = True
    user.save(update_fields=["mobile_reply_enabled"])
    monkeypatch.setenv("AI1NET_WS_RETRY_SEC", "1")
    blocked = {**FAST, "AI1NET_DISABLE_DEVICE_WS": "1", "AI1NET_LONGPOLL_HOLD_SEC": "5"}
    server = Daphne(tmp_path, name="blocked", **blocked)
    desk = Desk(tmp_path)
    try:
        with phone(server, user.username, password) as session:
            desk.pair(server, session)
            desk.start()  # waits until the platform shows the bridge online
            assert _device(desk).channel_name.startswith(LONGPOLL_PREFIX)
            assert "falling back to HTTP long polling" in desk.process.log()
            state = session.get("/api/mobile/state").json()
            assert [(b["name"], b["online"]) for b in state["bridges"]] == [("desk", True)]

            # device -> platform requests go over push; answers come back over pull.
            start_session(desk)
            hook = desk.hook_async(ask([FRAMEWORK]))
            [question] = pending(session)
            response = answer(session, question, {"Which framework?": ["Vue"]})
            assert response.status_code == 200, response.text
            assert hook.result(30)["hookSpecificOutput"]["updatedInput"]["answers"] == {"Which framework?": "Vue"}
            sent = session.post("/api/mobile/sessions/sess-1/messages", json={"text": "also the docs"},
                                headers=csrf(session))
            assert sent.status_code == 201, sent.text
            wait_until(lambda: "message.queued" in desk.audit(), timeout=15, message="the message on the desk")
            prompt = {"session_id": "sess-1", "hook_event_name": "UserPromptSubmit", "prompt": "go on"}
            assert desk.hook(prompt)["hookSpecificOutput"]["additionalContext"].endswith("also the docs")
            wait_until(lambda: PhoneMessage.objects.get().state == PhoneMessage.State.CONSUMED, timeout=15,
                       message="consumed on the platform")
            assert Device.objects.get(pk=desk.device_id).acked_seq >= 2

            # The daemon stops: the phone sees the bridge offline within the heartbeat window (at once
            # when a pull was held at that moment, since the cancelled pull clears its channel).
            desk.process.stop()
            window = 3 * int(FAST["AI1NET_HEARTBEAT_SEC"]) + 4
            wait_until(lambda: [(b["name"], b["online"]) for b in session.get("/api/mobile/state").json()["bridges"]]
                       == [("desk", False)], timeout=window, message="the bridge offline on the phone")
            desk.start()
            assert _device(desk).is_long_polling

            # The network stops blocking WebSockets: the bridge goes back to the tunnel by itself.
            server.stop()
            server = Daphne(tmp_path, port=server.port, name="open", **FAST)
            wait_until(lambda: _device(desk).is_online and not _device(desk).is_long_polling, timeout=30,
                       message="the bridge back on the WebSocket")
            hook = desk.hook_async(ask([FRAMEWORK], tool_use_id="toolu_2"))
            [question] = pending(session)
            assert answer(session, question, {"Which framework?": ["React"]}).status_code == 200
            assert hook.result(30)["hookSpecificOutput"]["updatedInput"]["answers"] == {"Which framework?": "React"}
            assert Question.objects.filter(state=Question.State.ANSWERED).count() == 2
            assert desk.audit().count("answer.apply") == 2
    finally:
        desk.stop()
        server.stop()
