"""The bridge's side of "no self-excitation": it injects only what a person typed on the phone, and
never the agent's own last words coming back."""

from __future__ import annotations

from tests.bridge import test_mobile_logic as logic

bridge = logic.bridge  # the MobileBridge fixture with a fake tunnel


async def test_only_user_authored_messages_are_queued(bridge):
    await bridge.on_message({"message_id": "m1", "session_id": "s1", "text": "from a device"})
    await bridge.on_message({"message_id": "m2", "session_id": "s1", "text": "from an agent", "author": "agent"})
    assert await bridge.dispatch("user-prompt-submit", {"session_id": "s1"}) == {"messages": []}
    assert [e["reason"] for e in bridge.audit.entries() if e["event"] == "message.refused"] == ["not_user", "not_user"]
    await bridge.on_message({"message_id": "m3", "session_id": "s1", "text": "typed", "author": "user"})
    assert await bridge.dispatch("user-prompt-submit", {"session_id": "s1"}) == {"messages": [{"message_id": "m3",
                                                                                   "text": "typed"}]}


async def test_the_agents_last_message_coming_back_is_dropped_not_injected(bridge):
    await bridge.on_keep_going({"session_id": "s1", "enabled": True})
    said = "I refactored the parser.\nShall I go on?"
    stop = {"session_id": "s1", "stop_hook_active": False, "last_assistant_message": said}
    assert await bridge.dispatch("stop", stop) == {"state": "wait"}
    await bridge.on_message({"message_id": "echo", "session_id": "s1", "text": "i refactored the parser. shall I go on?",
                             "author": "user"})
    await bridge.on_message({"message_id": "real", "session_id": "s1", "text": "yes, go on", "author": "user"})
    assert await bridge.dispatch("stop", {**stop, "stop_hook_active": True}) == {"state": "message",
                                                                                  "text": "yes, go on"}
    assert [e["message_id"] for e in bridge.audit.entries() if e["event"] == "message.echo_dropped"] == ["echo"]
    assert await bridge.dispatch("user-prompt-submit", {"session_id": "s1"}) == {"messages": []}  # gone for good


# --- declared field limits, on the bridge's side -------------------------------------------------

async def test_an_oversize_question_is_refused_before_it_is_sent(bridge):
    import pytest

    from clients.bridge.local_api import RequestRefused
    from clients.limits import LIMITS

    long_text = "q" * (LIMITS["question.question"].max + 1)
    body = logic.ask_body(tool_input={"questions": [{**logic.QUESTION, "question": long_text}]})
    with pytest.raises(RequestRefused) as caught:
        await bridge.dispatch("pre-tool-use", body)
    assert caught.value.status == 413  # the hook fails open: the desk dialog appears as usual
    assert bridge.tunnel.methods() == []
    [refused] = [e for e in bridge.audit.entries() if e["event"] == "question.refused"]
    assert refused["code"] == "too_large" and "questions[0].question" in refused["detail"]
    # A long working folder is display only: cut to fit, never refused.
    await bridge.dispatch("session-start", {"session_id": "s9", "cwd": "/" + "d" * 5000})
    [params] = await logic.drain_reports(bridge, "mobile.session_start")
    assert len(params["cwd"]) == LIMITS["session.cwd"].max and params["cwd"].endswith("ddd")


def test_pairing_checks_the_declared_limits_before_sending():
    import io

    import pytest

    from clients.common.pairing import PairingError, pair
    from clients.limits import LIMITS

    with pytest.raises(PairingError, match=r"name is too large: at most 100 characters"):
        # Port 9 (discard) is never contacted: the name is refused first.
        pair("http://127.0.0.1:9", name="n" * (LIMITS["device.name"].max + 1), kind="bridge", version="1",
             out=io.StringIO())
