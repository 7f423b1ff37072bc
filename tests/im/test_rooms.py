"""Rooms, messages by cursor, panels and the one action registry."""

import pytest
from channels.db import database_sync_to_async

from ai1net.exceptions import NotFound
from im import events, panels, services
from im.models import Message, Panel, PanelAction, Room
from tests.mobile.factories import bridge_for
from tests.mobile.ws import communicator, session_cookie


@pytest.fixture
def room(user):
    device = bridge_for(user)
    return services.room_open_for_session(owner=user, device=device, agent_session_id="s1", title="shop")


@pytest.mark.django_db
def test_seq_is_per_room_and_monotonic(room, user):
    other = services.room_get_or_create_studio(user=user, device=room.device)
    seqs = [services.message_post(room=room, author_user=user, kind="text", body={"text": str(i)}).seq for i in range(3)]
    assert seqs == [1, 2, 3]
    assert services.message_post(room=other, author_user=user, kind="text", body={"text": "x"}).seq == 1
    assert Room.objects.get(pk=room.pk).next_seq == 4


@pytest.mark.django_db
def test_session_room_and_studio_room_are_get_or_create(room, user):
    again = services.room_open_for_session(owner=user, device=room.device, agent_session_id="s1")
    assert again.pk == room.pk
    services.room_close(room=room)
    reopened = services.room_open_for_session(owner=user, device=room.device, agent_session_id="s1")
    assert reopened.pk == room.pk and reopened.state == "open"
    studio = services.room_get_or_create_studio(user=user, device=room.device)
    assert services.room_get_or_create_studio(user=user, device=room.device).pk == studio.pk
    assert studio.kind == "studio" and studio.members.filter(user=user).exists()


@pytest.mark.django_db
def test_an_existing_room_is_found_in_one_statement_as_the_orm_reads_it(room, user, django_assert_num_queries):
    studio = services.room_get_or_create_studio(user=user, device=room.device)
    with django_assert_num_queries(2):  # each room by its unique lookup, written once (ai1net.sql)
        found = services.room_get_or_create_studio(user=user, device=room.device)
        again = services.room_open_for_session(owner=user, device=room.device, agent_session_id="s1")
    for got, stored in ((found, Room.objects.get(pk=studio.pk)), (again, Room.objects.get(pk=room.pk))):
        assert [getattr(got, f.attname) for f in Room._meta.concrete_fields] == [
            getattr(stored, f.attname) for f in Room._meta.concrete_fields]


@pytest.mark.django_db
def test_a_message_has_one_author(room, user):
    from ai1net.exceptions import ValidationFailed

    with pytest.raises(ValidationFailed):
        services.message_post(room=room, author_user=user, author_device=room.device, kind="text", body={})


@pytest.mark.django_db
def test_message_post_emits_after_commit(room, user, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks() as callbacks:
        services.message_post(room=room, author_user=user, kind="text", body={"text": "hi"})
    assert len(callbacks) == 1


@pytest.mark.django_db
def test_rest_lists_rooms_and_pages_messages_by_cursor(api, room, user):
    for i in range(5):
        services.message_post(room=room, author_device=room.device, kind="event", body={"n": i})
    assert [r["id"] for r in api.get("/api/im/rooms").json()["rooms"]] == [str(room.pk)]
    first = api.get(f"/api/im/rooms/{room.pk}/messages?after=0&limit=2").json()
    assert [m["seq"] for m in first["messages"]] == [1, 2] and first["next_after"] == 2
    rest = api.get(f"/api/im/rooms/{room.pk}/messages?after={first['next_after']}&limit=50").json()
    assert [m["seq"] for m in rest["messages"]] == [3, 4, 5]
    assert api.get(f"/api/im/rooms/{room.pk}/messages?after=x").status_code == 400


@pytest.mark.django_db
def test_rest_post_message_and_closed_room(api, room, user):
    response = api.post(f"/api/im/rooms/{room.pk}/messages", {"text": "hello"}, content_type="application/json")
    assert response.status_code == 201
    assert response.json()["body"] == {"text": "hello"} and response.json()["author_user"] == user.pk
    services.room_close(room=room)
    closed = api.post(f"/api/im/rooms/{room.pk}/messages", {"text": "late"}, content_type="application/json")
    assert closed.status_code == 409 and closed.json()["error"] == "room_closed"


@pytest.mark.django_db
def test_non_members_get_404_everywhere(client, room, other_user):
    client.force_login(other_user)
    panel = services.panel_create(room=room, kind="test.kind", spec={})
    assert client.get("/api/im/rooms").json()["rooms"] == []
    for url in [f"/api/im/rooms/{room.pk}", f"/api/im/rooms/{room.pk}/messages", f"/api/im/rooms/{room.pk}/panels",
                "/api/im/rooms/not-a-uuid/messages"]:
        assert client.get(url).status_code == 404, url
    assert client.post(f"/api/im/rooms/{room.pk}/messages", {"text": "x"},
                       content_type="application/json").status_code == 404
    assert client.post(f"/api/im/rooms/{room.pk}/panels/{panel.pk}/actions", {"action": "x"},
                       content_type="application/json").status_code == 404


@pytest.mark.django_db
def test_panel_actions_dispatch_through_the_registry(api, room, user):
    seen = []

    def handler(*, actor, panel, action, data):
        seen.append((actor, panel.pk, action, data))
        return {"ok": True}

    panels.register("test.echo", handler)
    panel = services.panel_create(room=room, kind="test.echo", spec={"x": 1})
    listed = api.get(f"/api/im/rooms/{room.pk}/panels").json()["panels"]
    assert [(p["id"], p["kind"], p["spec"]) for p in listed] == [(panel.pk, "test.echo", {"x": 1})]
    response = api.post(f"/api/im/rooms/{room.pk}/panels/{panel.pk}/actions",
                        {"action": "press", "data": {"nonce": "secret", "v": 2}}, content_type="application/json")
    assert response.status_code == 200 and response.json() == {"ok": True}
    assert seen == [(user, panel.pk, "press", {"nonce": "secret", "v": 2})]
    assert PanelAction.objects.get(panel=panel).data == {"v": 2}  # no secrets kept
    unknown = services.panel_create(room=room, kind="nobody.handles", spec={})
    assert api.post(f"/api/im/rooms/{room.pk}/panels/{unknown.pk}/actions", {"action": "press"},
                    content_type="application/json").status_code == 404


@pytest.mark.django_db
def test_the_mobile_question_panel_is_registered():
    from mobile.panels import question_panel_action

    assert panels.handler_for("mobile.question") is question_panel_action


@pytest.mark.django_db(transaction=True)
async def test_room_socket_for_members_only(client, user, other_user):
    def make():
        device = bridge_for(user)
        return services.room_open_for_session(owner=user, device=device, agent_session_id="s1")

    room = await database_sync_to_async(make)()
    key = await database_sync_to_async(session_cookie)(client, user)
    ws = communicator(f"/ws/rooms/{room.pk}", key)
    assert (await ws.connect())[0]
    await database_sync_to_async(services.message_post)(room=room, author_user=user, kind="text", body={"text": "hi"})
    event = await ws.receive_json_from(timeout=5)
    assert event["type"] == events.MESSAGE_CREATED and event["message"]["body"] == {"text": "hi"}
    panel = await database_sync_to_async(services.panel_create)(room=room, kind="k", spec={})
    event = await ws.receive_json_from(timeout=5)
    assert event["type"] == events.PANEL_UPDATED and event["panel"]["id"] == panel.pk
    await ws.disconnect()

    other_key = await database_sync_to_async(session_cookie)(client, other_user)
    ws = communicator(f"/ws/rooms/{room.pk}", other_key)
    connected, code = await ws.connect()
    assert not connected and code == 4404
    assert await database_sync_to_async(Message.objects.filter(room=room).count)() == 1
    assert await database_sync_to_async(Panel.objects.filter(room=room).count)() == 1


@pytest.mark.django_db
def test_message_post_by_room_id_and_panel_state_set_by_id(room, user, django_capture_on_commit_callbacks):
    """The hot paths' forms (no room read, one UPDATE ... RETURNING for the panel) keep what the event says."""
    message = services.message_post(room_id=room.pk, author_user=user, kind="text", body={"text": "hi"})
    assert (message.room_id, message.seq) == (room.pk, 1)
    panel = services.panel_create(room_id=room.pk, message=message, kind="mobile.question", ref_id="q1",
                                  spec={"question_id": "q1", "n": [1, 2]}, state="pending")
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        updated = services.panel_state_set_by_id(panel_id=panel.pk, state="answered")
    assert len(callbacks) == 1
    stored = Panel.objects.get(pk=panel.pk)
    assert stored.state == "answered" and stored.spec == {"question_id": "q1", "n": [1, 2]}
    assert events.panel_data(updated) == events.panel_data(stored)
    for field in Panel._meta.concrete_fields:  # converted as the ORM converts them (a plan built once)
        assert getattr(updated, field.attname) == getattr(stored, field.attname), field.name
    moved = services.panel_state_set_by_id(panel_id=panel.pk, state="moved_to_desktop",
                                           spec_update={"reason": "timeout"})
    assert moved.spec == {"question_id": "q1", "n": [1, 2], "reason": "timeout"}
    assert Panel.objects.get(pk=panel.pk).spec["reason"] == "timeout"
    assert services.panel_state_set_by_id(panel_id=panel.pk + 1000, state="answered") is None


@pytest.mark.django_db
def test_a_posted_message_is_the_row_stored(room, user):
    body = {"text": "日本語 'q' \"d\" \u2028", "nested": [{"x": None}]}
    first = services.message_post(room=room, author_user=user, kind=Message.Kind.TEXT, body=body)
    second = services.message_post(room_id=room.pk, kind=Message.Kind.EVENT, body={})
    assert (first.seq, second.seq) == (1, 2)
    stored = Message.objects.get(pk=first.pk)
    assert (stored.seq, stored.author_user_id, stored.author_device_id, stored.kind, stored.body) == (
        1, user.pk, None, "text", body)
    assert stored.created_at == first.created_at and Message.objects.get(pk=second.pk).seq == 2
    room_id = room.pk
    room.delete()
    with pytest.raises(NotFound):
        services.message_post(room_id=room_id, kind=Message.Kind.EVENT, body={})


@pytest.mark.django_db
def test_a_message_posted_with_a_panel_state_sets_it_in_the_same_write(room, user, monkeypatch,
                                                                        django_assert_num_queries):
    """What an answer does: its room message and its panel's new state (one statement on PostgreSQL), the
    events in the order the two calls gave them, and the panel the event carries as stored."""
    from django.db import connection

    first = services.message_post(room_id=room.pk, author_user=user, kind="text", body={"text": "q"})
    panel = services.panel_create(room_id=room.pk, message=first, kind="mobile.question", ref_id="q1",
                                  spec={"question_id": "q1"}, state="pending")
    seen = []
    monkeypatch.setattr(events, "message_created", lambda message: seen.append(("message", message.seq)))
    monkeypatch.setattr(events, "panel_updated", lambda panel: seen.append(("panel", events.panel_data(panel))))
    with django_assert_num_queries(1 if connection.vendor == "postgresql" else 3):
        message = services.message_post(room_id=room.pk, author_user=user, kind="answer", body={"a": 1},
                                        panel_state=(panel.pk, "answered"))
    stored = Panel.objects.get(pk=panel.pk)
    assert message.seq == 2 and Message.objects.get(pk=message.pk).body == {"a": 1}
    assert stored.state == "answered" and stored.spec == {"question_id": "q1"}
    assert seen == [("message", 2), ("panel", events.panel_data(stored))]
    seen.clear()
    services.message_post(room_id=room.pk, kind="event", body={}, panel_state=(panel.pk + 1000, "answered"))
    assert seen == [("message", 3)]  # no such panel: the message alone, no panel event
    with pytest.raises(NotFound):
        services.message_post(room_id=room.pk.__class__(int=0), kind="event", body={},
                              panel_state=(panel.pk, "expired"))


@pytest.mark.django_db(transaction=True)
def test_a_message_and_its_panel_state_are_one_write_even_outside_a_transaction(room, user, monkeypatch):
    """The panel's state is set in the message's own write: when that fails, no message stays behind
    (on PostgreSQL it is the message's statement itself; elsewhere its own UPDATE in the same transaction)."""
    first = services.message_post(room_id=room.pk, author_user=user, kind="text", body={"text": "q"})
    panel = services.panel_create(room_id=room.pk, message=first, kind="mobile.question", ref_id="q1",
                                  spec={"question_id": "q1"}, state="pending")
    from django.db import DataError, connection

    if connection.vendor == "postgresql":
        broken = (panel.pk, "x" * 10_000)  # longer than the state column: the one statement fails
    else:
        def fails(**kwargs):
            raise RuntimeError("the panel's UPDATE failed")

        monkeypatch.setattr(services, "panel_state_set_by_id", fails)
        broken = (panel.pk, "answered")
    with pytest.raises((DataError, RuntimeError)):
        services.message_post(room_id=room.pk, author_user=user, kind="answer", body={"a": 1}, panel_state=broken)
    assert list(Message.objects.filter(room=room).values_list("seq", flat=True)) == [1]
    assert Panel.objects.get(pk=panel.pk).state == "pending"
