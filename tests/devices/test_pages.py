"""Pairing pages, the device list page and its API (rename, revoke), live presence for the owner."""

from __future__ import annotations

import asyncio

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client

from ai1net import realtime
from ai1net.accounts.models import AuditEntry
from devices import services
from devices.consumers import DevicesPageConsumer
from devices.models import Device, PairingRequest


@pytest.mark.django_db
def test_pair_pages_need_a_login(client, start_pairing):
    body = start_pairing()
    assert client.get("/pair/").status_code == 302
    response = client.get(f"/pair/{body['user_code']}")
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]
    assert PairingRequest.objects.get().state == PairingRequest.State.PENDING


@pytest.mark.django_db
def test_typing_the_code_leads_to_the_pairing_page(api, start_pairing):
    body = start_pairing()
    response = api.post("/pair/", {"user_code": body["user_code"].lower()})
    assert response.status_code == 302 and response["Location"] == f"/pair/{body['user_code']}"
    assert api.post("/pair/", {"user_code": "12"}).status_code == 200


@pytest.mark.django_db
def test_pairing_page_shows_the_device_and_a_qr(api, start_pairing, user):
    body = start_pairing(name="work laptop", hostname="wl-01", os="macOS 15")
    page = api.get(f"/pair/{body['user_code']}")
    html = page.content.decode()
    assert page.status_code == 200
    for text in ("work laptop", "wl-01", "macOS 15", "Bridge (desktop)", body["user_code"], "<svg", 'id="approve"'):
        assert text in html, text
    assert "csrfmiddlewaretoken" in html
    pairing = PairingRequest.objects.get()
    assert pairing.state == PairingRequest.State.SCANNED and pairing.user == user


@pytest.mark.django_db
def test_pairing_page_for_a_wrong_code_is_404(api):
    assert api.get("/pair/BBBB-CCCC").status_code == 404


@pytest.mark.django_db
def test_device_list_page_and_api_are_scoped_to_the_owner(api, user, other_user):
    mine, _ = services.device_create(owner=user, name="my laptop", kind="bridge")
    theirs, _ = services.device_create(owner=other_user, name="their server", kind="probe")
    page = api.get("/devices/").content.decode()
    assert "my laptop" in page and "their server" not in page and "offline" in page
    listed = api.get("/api/devices").json()
    assert [d["id"] for d in listed] == [str(mine.pk)]
    assert listed[0]["online"] is False
    assert api.get(f"/api/devices/{theirs.pk}").status_code == 404
    assert api.patch(f"/api/devices/{theirs.pk}", {"name": "x"}, content_type="application/json").status_code == 404
    assert api.post(f"/api/devices/{theirs.pk}/revoke").status_code == 404
    assert Device.objects.get(pk=theirs.pk).status == Device.Status.ACTIVE


@pytest.mark.django_db
def test_rename_and_revoke(api, user):
    device, _ = services.device_create(owner=user, name="old", kind="bridge")
    renamed = api.patch(f"/api/devices/{device.pk}", {"name": "new name"}, content_type="application/json")
    assert renamed.status_code == 200 and renamed.json()["name"] == "new name"
    assert api.patch(f"/api/devices/{device.pk}", {"name": ""}, content_type="application/json").status_code == 400
    revoked = api.post(f"/api/devices/{device.pk}/revoke")
    assert revoked.status_code == 200 and revoked.json()["status"] == "revoked"
    assert AuditEntry.objects.filter(action="devices.device.revoke", actor=user).count() == 1
    # revoking again changes nothing and audits nothing more
    assert api.post(f"/api/devices/{device.pk}/revoke").status_code == 200
    assert AuditEntry.objects.filter(action="devices.device.revoke").count() == 1


@pytest.mark.django_db
def test_device_api_keeps_csrf(user):
    device, _ = services.device_create(owner=user, name="d", kind="bridge")
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(user)
    assert browser.post(f"/api/devices/{device.pk}/revoke").status_code == 403
    assert Device.objects.get(pk=device.pk).status == Device.Status.ACTIVE


@pytest.mark.django_db(transaction=True)
async def test_presence_is_pushed_to_the_owners_page(user, other_user):
    device, _ = await sync_to_async(services.device_create)(owner=user, name="d", kind="bridge")
    mine = WebsocketCommunicator(DevicesPageConsumer.as_asgi(), "/ws/devices")
    mine.scope["user"] = user
    theirs = WebsocketCommunicator(DevicesPageConsumer.as_asgi(), "/ws/devices")
    theirs.scope["user"] = other_user
    assert (await mine.connect())[0] and (await theirs.connect())[0]
    await sync_to_async(services.device_revoke)(device=device, actor=user)
    event = await mine.receive_json_from(3)
    assert event["type"] == "devices.presence.changed" and event["device_id"] == str(device.pk)
    assert event["online"] is False
    assert await theirs.receive_nothing(0.3)
    await mine.disconnect()
    await theirs.disconnect()


@pytest.mark.django_db(transaction=True)
async def test_presence_changes_waiting_for_the_owners_pages_leave_together_and_arrive_in_order(user, monkeypatch):
    """A fleet's reconnect storm: while one presence send to the owner's pages is on its way, the changes after
    it wait and leave as one layer message (one Redis round trip, not one per device); the page gets every
    device's event, in order, as it always did."""
    devices = [(await sync_to_async(services.device_create)(owner=user, name=f"d{i}", kind="bridge"))[0]
               for i in range(4)]
    page = WebsocketCommunicator(DevicesPageConsumer.as_asgi(), "/ws/devices")
    page.scope["user"] = user
    assert (await page.connect())[0]
    sent, on_its_way, real_send = [], asyncio.Event(), realtime._send

    async def send(group, message):
        sent.append(message["type"])
        await on_its_way.wait()
        await real_send(group, message)

    monkeypatch.setattr(realtime, "_send", send)
    try:
        for device in devices:
            await sync_to_async(services.device_revoke)(device=device, actor=user)
        await asyncio.sleep(0.05)  # the loop takes every hand-over
        on_its_way.set()
        got = [await page.receive_json_from(3) for _ in devices]
    finally:
        on_its_way.set()
    assert sent == ["app.event", "app.events"]
    assert [event["device_id"] for event in got] == [str(device.pk) for device in devices]
    assert all(set(event) == {"type", "device_id", "online", "last_seen_at", "connection_count"}
               and event["type"] == "devices.presence.changed" and event["online"] is False for event in got)
    assert await page.receive_nothing(0.2)
    await page.disconnect()


async def test_presence_socket_needs_a_login():
    from django.contrib.auth.models import AnonymousUser

    comm = WebsocketCommunicator(DevicesPageConsumer.as_asgi(), "/ws/devices")
    comm.scope["user"] = AnonymousUser()
    connected, code = await comm.connect()
    assert not connected and code == 4401


@pytest.mark.django_db
def test_two_factor_users_must_verify_before_approving(api, user, start_pairing):
    from django_otp.plugins.otp_totp.models import TOTPDevice

    TOTPDevice.objects.create(user=user, name="phone", confirmed=True)
    body = start_pairing()
    assert api.post(f"/api/devices/pairings/code/{body['user_code']}/approve").status_code == 403
    assert api.get(f"/pair/{body['user_code']}").status_code == 403
    assert api.get("/devices/").status_code == 403
    assert PairingRequest.objects.get().state == PairingRequest.State.PENDING
