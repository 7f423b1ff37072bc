"""/ws/mobile: the user's own events only, OTP-verified where the user has OTP, gone with the switch."""

import pytest
from channels.db import database_sync_to_async
from django_otp import DEVICE_ID_SESSION_KEY
from django_otp.plugins.otp_totp.models import TOTPDevice

from ai1net.accounts.services import user_switch_set
from ai1net.accounts.sessions import SessionStore  # the engine's (SESSION_ENGINE)
from tests.mobile.factories import ask, bridge_for, enable_mobile
from tests.mobile.ws import communicator, session_cookie

pytestmark = [pytest.mark.django_db(transaction=True)]


async def test_the_phone_socket_gets_a_snapshot_then_new_questions(client, bridge, mobile_user):
    key = await database_sync_to_async(session_cookie)(client, mobile_user)
    ws = communicator("/ws/mobile", key)
    connected, _ = await ws.connect()
    assert connected
    snapshot = await ws.receive_json_from(timeout=5)
    assert snapshot["type"] == "mobile.snapshot" and snapshot["questions"] == []
    assert snapshot["state"]["bridges"][0]["device_id"] == str(bridge.pk)

    question, nonce = await database_sync_to_async(ask)(bridge)
    events = [await ws.receive_json_from(timeout=5) for _ in range(2)]
    created = next(e for e in events if e["type"] == "mobile.question.created")
    assert created["question"]["question_id"] == str(question.pk)
    assert created["question"]["nonce"] == nonce
    await ws.disconnect()


async def test_another_users_questions_do_not_reach_my_socket(client, bridge, mobile_user, other_user):
    key = await database_sync_to_async(session_cookie)(client, mobile_user)
    ws = communicator("/ws/mobile", key)
    assert (await ws.connect())[0]
    await ws.receive_json_from(timeout=5)  # snapshot

    def theirs():
        enable_mobile(other_user)
        ask(bridge_for(other_user, "theirs"), session_id="theirs")

    await database_sync_to_async(theirs)()
    assert await ws.receive_nothing(timeout=0.5)
    await ws.disconnect()


async def test_anonymous_and_switched_off_users_are_refused(client, user):
    ws = communicator("/ws/mobile")
    connected, code = await ws.connect()
    assert not connected and code == 4404
    key = await database_sync_to_async(session_cookie)(client, user)  # mobile reply still off
    ws = communicator("/ws/mobile", key)
    connected, code = await ws.connect()
    assert not connected and code == 4404


async def test_a_foreign_origin_is_refused(client, mobile_user):
    key = await database_sync_to_async(session_cookie)(client, mobile_user)
    ws = communicator("/ws/mobile", key, origin="https://evil.example")
    connected, _ = await ws.connect()
    assert not connected


async def test_turning_the_switch_off_closes_the_socket(client, bridge, mobile_user):
    key = await database_sync_to_async(session_cookie)(client, mobile_user)
    ws = communicator("/ws/mobile", key)
    assert (await ws.connect())[0]
    await ws.receive_json_from(timeout=5)
    await database_sync_to_async(user_switch_set)(actor=mobile_user, user=mobile_user, switch="mobile_reply",
                                                  enabled=False)
    event = await ws.receive_json_from(timeout=5)
    assert event == {"type": "mobile.switch.changed", "enabled": False}
    closed = await ws.receive_output(timeout=5)
    assert closed == {"type": "websocket.close", "code": 4404}


async def test_a_user_with_otp_needs_a_verified_session(client, mobile_user):
    def enrol_and_login():
        device = TOTPDevice.objects.create(user=mobile_user, name="phone", confirmed=True)
        return session_cookie(client, mobile_user), device.persistent_id

    key, persistent_id = await database_sync_to_async(enrol_and_login)()
    ws = communicator("/ws/mobile", key)
    connected, code = await ws.connect()
    assert not connected and code == 4404

    def verify():
        store = SessionStore(session_key=key)
        store[DEVICE_ID_SESSION_KEY] = persistent_id
        store.save()

    await database_sync_to_async(verify)()
    ws = communicator("/ws/mobile", key)
    connected, _ = await ws.connect()
    assert connected
    await ws.disconnect()
