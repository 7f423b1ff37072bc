"""The QR pairing ceremony (RFC 8628 semantics): every state, transition and refusal."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from ai1net.accounts import ratelimit
from ai1net.accounts.models import AuditEntry
from ai1net.accounts.services import hash_secret
from devices import services
from devices.models import Device, PairingRequest

pytestmark = pytest.mark.django_db

CODE = re.compile(r"^[BCDFGHJKLMNPQRSTVWXZ]{4}-[BCDFGHJKLMNPQRSTVWXZ]{4}$")


def poll(client, device_code):
    return client.post("/api/devices/pairings/token", {"device_code": device_code}, content_type="application/json")


def allow_next_poll(device_code):
    """Pretend the device waited its interval (instead of sleeping in the test)."""
    PairingRequest.objects.filter(device_code_hash=hash_secret(device_code)).update(
        last_polled_at=timezone.now() - timedelta(seconds=120)
    )


def pairing_of(body) -> PairingRequest:
    return PairingRequest.objects.get(device_code_hash=hash_secret(body["device_code"]))


def test_create_returns_rfc8628_fields_and_stores_only_hashes(start_pairing, settings):
    settings.PUBLIC_URL = ""
    body = start_pairing()
    assert set(body) == {"device_code", "user_code", "verification_uri", "verification_uri_complete", "expires_in",
                         "interval"}
    assert CODE.match(body["user_code"])
    assert len(body["device_code"]) >= 22  # >= 128 bits of URL-safe base64
    assert body["verification_uri"] == "http://testserver/pair/"
    assert body["verification_uri_complete"] == f"http://testserver/pair/{body['user_code']}"
    assert 540 <= body["expires_in"] <= 600
    assert body["interval"] >= 1
    pairing = pairing_of(body)
    assert pairing.state == PairingRequest.State.PENDING
    assert pairing.user_code_hash == hash_secret(body["user_code"].replace("-", ""))
    stored = str(PairingRequest.objects.filter(pk=pairing.pk).values().get())
    assert body["device_code"] not in stored and body["user_code"].replace("-", "") not in stored
    assert pairing.requested_from == "203.0.113.7"


def test_verification_uri_uses_public_url(start_pairing, settings):
    settings.PUBLIC_URL = "https://ai1net.example"
    body = start_pairing()
    assert body["verification_uri_complete"] == f"https://ai1net.example/pair/{body['user_code']}"


@pytest.mark.parametrize("field,value", [("kind", "toaster"), ("name", "")])
def test_create_validates_input(device_client, field, value):
    body = {"name": "x", "kind": "bridge", field: value}
    response = device_client.post("/api/devices/pairings", body, content_type="application/json")
    assert response.status_code == 400
    assert response.json()["error"] == "invalid"


def test_create_is_rate_limited_per_address(device_client):
    limit = ratelimit.PAIRING_CREATE_PER_ADDRESS.limit
    statuses = [
        device_client.post("/api/devices/pairings", {"name": "x", "kind": "probe"}, content_type="application/json").status_code
        for _ in range(limit + 1)
    ]
    assert statuses[:limit] == [201] * limit
    assert statuses[limit] == 429
    other = Client(REMOTE_ADDR="198.51.100.1")
    assert other.post("/api/devices/pairings", {"name": "x", "kind": "probe"}, content_type="application/json").status_code == 201


def test_happy_path_pending_scanned_approved_claimed(start_pairing, device_client, api, user):
    body = start_pairing(ephemeral=True, kind="probe")
    response = poll(device_client, body["device_code"])
    assert response.status_code == 400 and response.json()["error"] == "authorization_pending"

    shown = api.get(f"/api/devices/pairings/code/{body['user_code']}")
    assert shown.status_code == 200
    assert shown.json()["name"] == "laptop" and shown.json()["state"] == "scanned"
    assert shown.json()["hostname"] == "host1" and shown.json()["kind"] == "probe"
    assert pairing_of(body).user == user

    allow_next_poll(body["device_code"])
    assert poll(device_client, body["device_code"]).json()["error"] == "authorization_pending"

    approved = api.post(f"/api/devices/pairings/code/{body['user_code']}/approve")
    assert approved.status_code == 200 and approved.json()["state"] == "approved"
    assert AuditEntry.objects.filter(action="devices.pairing.approve", actor=user).count() == 1

    claimed = poll(device_client, body["device_code"])
    assert claimed.status_code == 200
    token = claimed.json()["device_token"]
    assert len(token) >= 43  # 256 bits
    device = Device.objects.get(pk=claimed.json()["device_id"])
    assert device.owner == user and device.kind == "probe" and device.ephemeral
    assert device.token_hash == hash_secret(token)
    assert pairing_of(body).state == PairingRequest.State.CLAIMED

    again = poll(device_client, body["device_code"])
    assert again.status_code == 400 and again.json()["error"] == "invalid_grant"
    assert Device.objects.count() == 1


def test_user_code_may_be_typed_loosely(start_pairing, api):
    body = start_pairing()
    loose = body["user_code"].lower().replace("-", " ")
    assert api.get(f"/api/devices/pairings/code/{loose}").status_code == 200


def test_polling_faster_than_interval_gets_slow_down(start_pairing, device_client):
    body = start_pairing()
    assert poll(device_client, body["device_code"]).json()["error"] == "authorization_pending"
    fast = poll(device_client, body["device_code"])
    assert fast.status_code == 400 and fast.json()["error"] == "slow_down"
    assert pairing_of(body).interval == body["interval"] + services.SLOW_DOWN_STEP
    allow_next_poll(body["device_code"])
    assert poll(device_client, body["device_code"]).json()["error"] == "authorization_pending"


def test_deny_gives_access_denied(start_pairing, device_client, api, user):
    body = start_pairing()
    response = api.post(f"/api/devices/pairings/code/{body['user_code']}/deny")
    assert response.status_code == 200 and response.json()["state"] == "denied"
    assert poll(device_client, body["device_code"]).json()["error"] == "access_denied"
    assert AuditEntry.objects.filter(action="devices.pairing.deny", actor=user).exists()
    # decided: approving afterwards is refused
    late = api.post(f"/api/devices/pairings/code/{body['user_code']}/approve")
    assert late.status_code == 409
    assert Device.objects.count() == 0


def test_approve_twice_is_idempotent(start_pairing, api):
    body = start_pairing()
    assert api.post(f"/api/devices/pairings/code/{body['user_code']}/approve").status_code == 200
    assert api.post(f"/api/devices/pairings/code/{body['user_code']}/approve").json()["state"] == "approved"


@pytest.mark.parametrize("state", ["pending", "scanned", "approved", "denied"])
def test_every_state_before_claimed_expires(start_pairing, device_client, api, user, state):
    body = start_pairing()
    PairingRequest.objects.filter(pk=pairing_of(body).pk).update(
        state=state, user=user if state != "pending" else None, expires_at=timezone.now() - timedelta(seconds=1)
    )
    response = poll(device_client, body["device_code"])
    assert response.status_code == 400 and response.json()["error"] == "expired_token"
    assert pairing_of(body).state == PairingRequest.State.EXPIRED
    assert api.get(f"/api/devices/pairings/code/{body['user_code']}").status_code == 410
    assert api.post(f"/api/devices/pairings/code/{body['user_code']}/approve").status_code == 410


def test_claimed_does_not_expire(start_pairing, device_client, api):
    body = start_pairing()
    api.post(f"/api/devices/pairings/code/{body['user_code']}/approve")
    assert poll(device_client, body["device_code"]).status_code == 200
    PairingRequest.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    assert poll(device_client, body["device_code"]).json()["error"] == "invalid_grant"
    assert pairing_of(body).state == PairingRequest.State.CLAIMED


def test_unknown_device_code(device_client):
    response = poll(device_client, "nope")
    assert response.status_code == 400 and response.json()["error"] == "invalid_grant"


def test_another_users_scanned_code_is_404(start_pairing, api, client, other_user):
    body = start_pairing()
    assert api.get(f"/api/devices/pairings/code/{body['user_code']}").status_code == 200
    intruder = Client()
    intruder.force_login(other_user)
    assert intruder.get(f"/api/devices/pairings/code/{body['user_code']}").status_code == 404
    assert intruder.post(f"/api/devices/pairings/code/{body['user_code']}/approve").status_code == 404
    assert pairing_of(body).state == PairingRequest.State.SCANNED


def test_approve_needs_a_login(start_pairing, client):
    body = start_pairing()
    assert client.post(f"/api/devices/pairings/code/{body['user_code']}/approve").status_code in (401, 403)
    assert client.get(f"/api/devices/pairings/code/{body['user_code']}").status_code in (401, 403)
    assert pairing_of(body).state == PairingRequest.State.PENDING


def test_approve_keeps_csrf_for_browser_sessions(start_pairing, user):
    body = start_pairing()
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(user)
    assert browser.post(f"/api/devices/pairings/code/{body['user_code']}/approve").status_code == 403
    assert pairing_of(body).state != PairingRequest.State.APPROVED


def test_brute_force_of_user_codes_is_stopped_per_user(start_pairing, api):
    body = start_pairing()
    wrong = "BBBB-BBBB" if body["user_code"] != "BBBB-BBBB" else "CCCC-CCCC"
    limit = ratelimit.PAIRING_CODE_PER_ACCOUNT.limit
    statuses = [api.get(f"/api/devices/pairings/code/{wrong}").status_code for _ in range(limit)]
    assert statuses == [404] * limit
    # Now even the right code is refused: guessing cannot continue.
    assert api.get(f"/api/devices/pairings/code/{body['user_code']}").status_code == 429
    assert api.post(f"/api/devices/pairings/code/{body['user_code']}/approve").status_code == 429
    assert pairing_of(body).state == PairingRequest.State.PENDING


def test_brute_force_of_user_codes_is_stopped_per_address(start_pairing, django_user_model):
    body = start_pairing()
    limit = ratelimit.PAIRING_CODE_PER_ADDRESS.limit
    per_user = ratelimit.PAIRING_CODE_PER_ACCOUNT.limit
    tries = 0
    for i in range(limit // per_user + 1):
        account = django_user_model.objects.create_user(username=f"guesser{i}", password="x-long-password-1")
        c = Client(REMOTE_ADDR="192.0.2.9")
        c.force_login(account)
        for _ in range(per_user):
            status = c.get("/api/devices/pairings/code/ZZZZ-ZZZZ").status_code
            if status == 429:
                break
            tries += 1
    assert tries == limit
    fresh = django_user_model.objects.create_user(username="fresh", password="x-long-password-1")
    c = Client(REMOTE_ADDR="192.0.2.9")
    c.force_login(fresh)
    assert c.get(f"/api/devices/pairings/code/{body['user_code']}").status_code == 429


def test_malformed_codes_count_as_wrong(api):
    for _ in range(ratelimit.PAIRING_CODE_PER_ACCOUNT.limit):
        assert api.get("/api/devices/pairings/code/hello").status_code == 404
    assert api.get("/api/devices/pairings/code/hello").status_code == 429


def test_user_codes_are_spread_over_the_alphabet(start_pairing):
    codes = {start_pairing()["user_code"] for _ in range(20)}
    assert len(codes) == 20
