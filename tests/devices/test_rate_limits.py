"""Guessing device secrets is limited per address (and per account where one is known): device tokens on
the tunnel and the long-poll, device codes on the pairing poll, user codes on the pairing page."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async
from django.test import Client

from ai1net.accounts import ratelimit
from ai1net.accounts.models import AuditEntry
from ai1net.accounts.ratelimit import Limit
from clients import protocol
from devices import services
from tests.devices.tunnel_support import Device as FakeDevice

PULL = "/api/devices/bridge/pull"


@pytest.fixture
def shrink(monkeypatch):
    """Replace a named limit of the module by a small one (callers read it at call time)."""
    def apply(name: str, limit: int = 3, window: int = 60) -> Limit:
        small = Limit(getattr(ratelimit, name).scope, limit, window)
        monkeypatch.setattr(ratelimit, name, small)
        return small
    return apply


@pytest.fixture
def user(django_user_model):
    """Without a password: these tests never log in with one, and hashing it costs a second on a busy machine."""
    return django_user_model.objects.create(username="alice")


@pytest.fixture
def other_user(django_user_model):
    return django_user_model.objects.create(username="mallory")


@pytest.fixture(autouse=True)
def _isolated(isolated_device_signals):
    """Other apps react to connections; not wanted here."""


def lockouts(scope: str) -> int:
    return AuditEntry.objects.filter(action="security.rate_limited", data__scope=scope).count()


def from_address(token: str | None, address: str) -> FakeDevice:
    device = FakeDevice(token)
    device.comm.scope["client"] = [address, 40000]  # what daphne puts there
    return device


@pytest.mark.django_db(transaction=True)
async def test_unknown_device_tokens_on_the_tunnel_are_limited_per_address(user, shrink):
    address = shrink("DEVICE_TOKEN_PER_ADDRESS")
    _, token = await sync_to_async(services.device_create)(owner=user, name="laptop", kind="bridge")
    for i in range(address.limit):
        guess = from_address(f"ai1d_guess{i}", "198.51.100.5")
        await guess.open()
        assert await guess.closed() == protocol.CLOSE_UNAUTHORIZED
    refused = from_address("ai1d_guess-after-the-limit", "198.51.100.5")
    await refused.open()
    assert await refused.closed() == protocol.CLOSE_RATE_LIMITED
    assert protocol.CLOSE_RATE_LIMITED not in protocol.FINAL_CLOSE_CODES, "the client retries later"
    # A real token is never refused by the limit: 256 bits are not guessed, and others' bad tokens from a
    # shared address (a NAT) must not lock the owner's devices out.
    behind_the_same_address = from_address(token, "198.51.100.5")
    await behind_the_same_address.open()
    assert (await behind_the_same_address.hello())["deviceId"]
    await behind_the_same_address.comm.disconnect()
    assert await sync_to_async(lockouts)(address.scope) == 1


@pytest.mark.django_db(transaction=True)
def test_unknown_device_tokens_on_the_long_poll_are_limited_per_address(user, shrink, settings):
    settings.DEVICE_LONGPOLL_HOLD_SEC = 0.2
    settings.DEVICE_LONGPOLL_TICK_SEC = 0.05
    address = shrink("DEVICE_TOKEN_PER_ADDRESS")
    _, token = services.device_create(owner=user, name="desk", kind="bridge")

    def pull(raw: str, ip: str = "198.51.100.5"):
        return Client(REMOTE_ADDR=ip).post(PULL, {"ackedSeq": 0}, content_type="application/json",
                                           HTTP_AUTHORIZATION=f"Bearer {raw}")

    for i in range(address.limit):
        assert pull(f"ai1d_guess{i}").status_code == 401
    refused = pull("ai1d_guess-after-the-limit")
    assert refused.status_code == 429 and int(refused["Retry-After"]) > 0
    assert refused.json()["error"] == "rate_limited" and "Try again in " in refused.json()["detail"]
    assert pull(token).status_code == 200, "a real token from the limited address is not refused"
    assert lockouts(address.scope) == 1


@pytest.mark.django_db
def test_unknown_device_codes_on_the_pairing_poll_are_limited_per_address(start_pairing, device_client, shrink):
    address = shrink("DEVICE_CODE_PER_ADDRESS")
    body = start_pairing()

    def poll(code: str, client: Client = device_client):
        return client.post("/api/devices/pairings/token", {"device_code": code}, content_type="application/json")

    for i in range(address.limit):
        assert poll(f"guess{i}").json()["error"] == "invalid_grant"
    refused = poll(body["device_code"])
    assert refused.status_code == 429 and int(refused["Retry-After"]) > 0
    assert refused.json()["retry_after"] > 0
    other = poll(body["device_code"], Client(REMOTE_ADDR="203.0.113.8"))
    assert other.json()["error"] == "authorization_pending", "another address polls on"
    assert lockouts(address.scope) == 1


@pytest.mark.django_db
def test_wrong_user_codes_name_the_wait_on_the_api_and_the_page(user, other_user, shrink):
    account = shrink("PAIRING_CODE_PER_ACCOUNT")
    browser = Client(REMOTE_ADDR="198.51.100.7")
    browser.force_login(user)
    for _ in range(account.limit):
        assert browser.get("/api/devices/pairings/code/BBBB-BBBB").status_code == 404
    api = browser.get("/api/devices/pairings/code/CCCC-CCCC")
    assert api.status_code == 429 and int(api["Retry-After"]) > 0 and api.json()["retry_after"] > 0
    page = browser.get("/pair/CCCC-CCCC")
    assert page.status_code == 429 and int(page["Retry-After"]) > 0 and b"Try again in " in page.content
    assert lockouts(account.scope) == 1
    audit = AuditEntry.objects.get(action="security.rate_limited")
    assert audit.actor_id == user.pk and audit.ip == "198.51.100.7"
    other = Client(REMOTE_ADDR="198.51.100.7")  # same address, below its own limit
    other.force_login(other_user)
    assert other.get("/api/devices/pairings/code/CCCC-CCCC").status_code == 404, "another account guesses on"
