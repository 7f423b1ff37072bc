"""The credential file and the pairing ceremony (against a fake pairing endpoint)."""

from __future__ import annotations

import io
import stat

import pytest

from clients.common.credentials import Credential, CredentialError, load_credential, save_credential
from clients.common.pairing import PairingError, pair
from tests.clients.fakes import FakePairingServer, approved, pending


def test_credential_round_trip_is_private(tmp_path):
    home = tmp_path / "home"
    assert load_credential(home) is None
    cred = Credential(url="http://127.0.0.1:8000", device_id="d1", token="secret-token", kind="bridge", name="desk")
    path = save_credential(home, cred)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_credential(home) == cred
    assert "secret-token" not in repr(cred)
    save_credential(home, Credential(url="u", device_id="d2", token="t2", kind="bridge", name="n"))
    assert load_credential(home).device_id == "d2"
    assert [p.name for p in home.iterdir()] == ["credential.json"]  # no temp files left behind


def test_a_broken_credential_says_so(tmp_path):
    (tmp_path / "credential.json").write_text('{"url": "x"}')
    with pytest.raises(CredentialError, match="pair this device again"):
        load_credential(tmp_path)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def __call__(self) -> float:
        return self.now


def run_pair(server: FakePairingServer, clock: Clock, out: io.StringIO) -> Credential:
    return pair(server.url, name="desk", kind="bridge", hostname="host1", os_name="Linux 6", version="0.1.0",
                out=out, sleep=clock.sleep, clock=clock)


def test_pair_polls_at_the_interval_and_slows_down_when_told():
    answers = [pending(), (400, {"error": "slow_down"}), pending(), approved()]
    with FakePairingServer(token_answers=answers, interval=5) as server:
        clock, out = Clock(), io.StringIO()
        cred = run_pair(server, clock, out)
    assert clock.sleeps == [5, 5, 10, 10]
    assert cred == Credential(url=server.url, device_id="8d5c0d1e-0000-4000-8000-000000000001", token="t" * 43,
                              kind="bridge", name="desk")
    assert server.grant_requests == [{"name": "desk", "kind": "bridge", "hostname": "host1", "os": "Linux 6",
                                      "version": "0.1.0"}]
    assert all(body == {"device_code": "d" * 43} for body in server.token_requests)
    text = out.getvalue()
    assert "code: BCDF-GHJK" in text and "/pair/" in text
    assert "\u2588" in text or "\u2580" in text or "\u2584" in text  # the QR drawn with block characters


@pytest.mark.parametrize(("error", "message"), [("access_denied", "denied"), ("expired_token", "expired")])
def test_pair_stops_with_a_clear_message(error, message):
    with FakePairingServer(token_answers=[pending(), (400, {"error": error})], interval=1) as server:
        with pytest.raises(PairingError, match=message):
            run_pair(server, Clock(), io.StringIO())


def test_pair_gives_up_when_the_code_expires():
    with FakePairingServer(token_answers=[], interval=5, expires_in=30) as server:
        clock = Clock()
        with pytest.raises(PairingError, match="expired"):
            run_pair(server, clock, io.StringIO())
    assert sum(clock.sleeps) >= 30 and len(server.token_requests) == 5


def test_pair_reports_a_refused_request_and_an_unreachable_platform():
    with FakePairingServer(token_answers=[], grant_status=429) as server:
        with pytest.raises(PairingError, match="too many"):
            run_pair(server, Clock(), io.StringIO())
    with pytest.raises(PairingError, match="cannot reach"):
        pair("http://127.0.0.1:9", name="d", kind="bridge", version="1", out=io.StringIO())
    with pytest.raises(PairingError, match="http"):
        pair("ftp://x", name="d", kind="bridge", version="1", out=io.StringIO())
