"""The agents' API and the authorization gateway, with the probe faked at probes.services.device_call.

Reads and sends run in a background thread that records the result in the row, so these tests use
`transaction=True` (the thread has its own database connection and must see committed rows).
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from ai1net.accounts.models import AuditEntry
from ai1net.exceptions import ApplicationError
from probes.models import ProbeCommand
from tests.e2e_support import wait_until
from tests.probes_platform.conftest import make_probe

pytestmark = pytest.mark.django_db(transaction=True)


def post_command(client, probe, op, args, wait=5, **extra):
    return client.post(f"/api/probes/{probe}/commands", {"op": op, "args": args, "wait": wait},
                       content_type="application/json", **extra)


def audit_actions() -> list[str]:
    return list(AuditEntry.objects.order_by("id").values_list("action", flat=True))


# --- router -------------------------------------------------------------------------------------

def test_list_shows_my_probes_with_roots_and_modes_only(api, user, other_user, writable_probe):
    make_probe(other_user, "theirs")
    make_probe(user, "old", online=False)
    make_probe(user, "gone", status="revoked")
    response = api.get("/api/probes/")
    assert response.status_code == 200
    body = response.json()
    assert [p["name"] for p in body] == ["server", "old"]  # online first; revoked and others' absent
    server = body[0]
    assert server["id"] == str(writable_probe.pk)
    assert server["online"] is True
    assert server["roots"] == ["/home/alice/proj"]
    assert server["modes"] == ["exec", "write"]
    assert body[1]["online"] is False and body[1]["modes"] == []


def test_someone_elses_probe_is_404_by_id_and_by_name(api, other_user, fake_probe):
    theirs = make_probe(other_user, "theirs")
    for key in (str(theirs.pk), "theirs"):
        assert api.get(f"/api/probes/{key}").status_code == 404
        response = post_command(api, key, "read", {"path": "/etc/passwd"})
        assert response.status_code == 404
        assert response.json()["error"] == "probe_not_found"
    assert fake_probe.calls == []
    assert not ProbeCommand.objects.exists()


def test_name_picks_the_online_probe_among_namesakes(api, user, fake_probe):
    make_probe(user, "box", online=False)
    live = make_probe(user, "box", online=True)
    make_probe(user, "box", online=False)
    response = post_command(api, "box", "ping", {})
    assert response.status_code == 200, response.json()
    assert response.json()["probe"]["id"] == str(live.pk)
    assert fake_probe.calls[0][0] == str(live.pk)


def test_unauthenticated_is_refused():
    client = Client()
    assert client.get("/api/probes/").status_code in (401, 403)
    assert client.post("/api/probes/x/commands", {}, content_type="application/json").status_code in (401, 403)


# --- reads --------------------------------------------------------------------------------------

def test_read_runs_at_once_with_the_exact_arguments_over_the_api_token(client, probe, token, fake_probe):
    fake_probe.answers["probe.read"] = {"content": "line 1\nline 2\n", "offset": 0}
    args = {"path": "/home/alice/proj/a.py", "offset": 0, "limit": 2}
    response = post_command(client, probe.name, "read", args, HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["state"] == "done"
    assert body["result"] == {"content": "line 1\nline 2\n", "offset": 0}
    assert "error" not in body
    assert fake_probe.calls == [(str(probe.pk), "probe.read", args)]
    command = ProbeCommand.objects.get(pk=body["id"])
    assert command.via == "api" and command.requested_by_id == probe.owner_id
    assert command.sent_at and command.finished_at
    assert client.get(f"/api/probes/commands/{body['id']}", HTTP_AUTHORIZATION=f"Bearer {token}").json() == body


def test_a_path_outside_the_allow_list_ends_failed_with_the_probes_code(api, probe, fake_probe):
    fake_probe.answers["probe.read"] = ApplicationError("/etc/passwd is outside the allowed roots.",
                                                        code="outside_allowed_roots", status=502)
    response = post_command(api, probe.pk, "read", {"path": "/etc/passwd"})
    assert response.status_code == 200
    body = response.json()
    assert body["state"] == "failed"
    assert body["error"] == {"code": "outside_allowed_roots", "detail": "/etc/passwd is outside the allowed roots."}
    assert "result" not in body
    entry = AuditEntry.objects.get()
    assert entry.action == "probe.command.refused" and entry.data["code"] == "outside_allowed_roots"
    assert entry.data["command"] == body["id"]


def test_an_offline_probe_fails_with_device_offline(api, probe, fake_probe):
    fake_probe.answers["probe.stat"] = ApplicationError("The device is offline.", code="device_offline", status=503)
    body = post_command(api, probe.pk, "stat", {"path": "/home/alice/proj"}).json()
    assert body["state"] == "failed" and body["error"]["code"] == "device_offline"


def test_a_slow_call_answers_202_then_the_get_long_polls_to_the_result(api, probe, fake_probe):
    release = fake_probe.gate

    def slow(params):
        assert release.wait(10)
        return {"matches": []}

    fake_probe.answers["probe.grep"] = slow
    response = post_command(api, probe.pk, "grep", {"pattern": "TODO"}, wait=0.2)
    assert response.status_code == 202
    body = response.json()
    assert body["state"] == "sent"
    assert api.get(f"/api/probes/commands/{body['id']}").status_code == 202
    release.set()
    done = api.get(f"/api/probes/commands/{body['id']}?wait=10")
    assert done.status_code == 200
    assert done.json()["state"] == "done" and done.json()["result"] == {"matches": []}


# --- validation ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("op", "args", "field"), [
    ("rm_rf", {}, "op"),
    (None, {}, "op"),
    ("read", [], "args"),
    ("read", {}, "args.path"),
    ("read", {"path": 7}, "args.path"),
    ("read", {"path": "a", "offset": "1"}, "args.offset"),
    ("read", {"path": "a", "limit": True}, "args.limit"),
    ("read", {"path": "a", "limit": -1}, "args.limit"),
    ("read_tree", {"path": "a", "depth": 1.5}, "args.depth"),
    ("grep", {"pattern": "x", "glob": ["*.py"]}, "args.glob"),
    ("write", {"path": "a"}, "args.content"),
    ("write", {"path": "a", "content": "x", "diff": "y"}, "args.content"),
    ("run", {"argv": "ls -la"}, "args.argv"),
    ("run", {"argv": []}, "args.argv"),
    ("run", {"argv": ["ls"], "timeout": "5"}, "args.timeout"),
    ("read", {"path": "a\x00b"}, "args.path"),
    ("run", {"argv": ["ls", "a\x00"]}, "args.argv"),
    ("grep", {"pattern": "x", "extra": {"k": ["\x00"]}}, "args.extra"),
])
def test_malformed_commands_are_400_naming_the_field(api, writable_probe, fake_probe, op, args, field):
    response = post_command(api, writable_probe.pk, op, args)
    assert response.status_code == 400
    assert response.json()["detail"].startswith(f"{field}:")
    assert not ProbeCommand.objects.exists()
    assert fake_probe.calls == []


def test_a_bad_wait_is_400(api, probe, fake_probe):
    response = post_command(api, probe.pk, "ping", {}, wait=-1)
    assert response.status_code == 400 and response.json()["detail"].startswith("wait:")


# --- writes and commands: modes and approval -----------------------------------------------------

@pytest.mark.parametrize(("op", "args", "flag"), [
    ("write", {"path": "/home/alice/proj/a.txt", "content": "hi\n"}, "--write"),
    ("run", {"argv": ["make", "test"], "cwd": "/home/alice/proj"}, "--exec"),
    ("run_background", {"argv": ["sleep", "60"]}, "--exec"),
])
def test_write_and_run_fail_not_permitted_on_a_read_only_probe_without_asking(api, probe, fake_probe, op, args, flag):
    response = post_command(api, probe.pk, op, args)
    assert response.status_code == 200
    body = response.json()
    assert body["state"] == "failed"
    assert body["error"]["code"] == "not_permitted" and flag in body["error"]["detail"]
    assert api.get("/api/probes/approvals").json() == []
    assert fake_probe.calls == []
    assert audit_actions() == ["probe.command.refused"]


def test_a_write_waits_for_approval_then_runs_exactly_once(api, user, writable_probe, fake_probe):
    fake_probe.answers["probe.read"] = {"lines": [[1, "keep"], [2, "old"]], "next_offset": None}
    fake_probe.answers["probe.write"] = {"written": 4}
    args = {"path": "/home/alice/proj/a.txt", "content": "keep\nnew\n"}
    response = post_command(api, writable_probe.pk, "write", args)
    assert response.status_code == 202
    command_id = response.json()["id"]
    assert response.json()["state"] == "awaiting_approval"
    # The diff preview is prepared from the current file (a read); the write itself is not sent.
    preview = wait_until(lambda: api.get(f"/api/probes/commands/{command_id}").json().get("preview"), 5)
    assert "-old" in preview and "+new" in preview and " keep" in preview
    assert fake_probe.methods() == ["probe.read"]
    pending = api.get("/api/probes/approvals").json()
    assert [c["id"] for c in pending] == [command_id]

    approved = api.post(f"/api/probes/commands/{command_id}/approve", {"wait": 5}, content_type="application/json")
    assert approved.status_code == 200, approved.json()
    assert approved.json()["state"] == "done" and approved.json()["result"] == {"written": 4}
    assert fake_probe.calls[-1] == (str(writable_probe.pk), "probe.write", args)

    again = api.post(f"/api/probes/commands/{command_id}/approve", {}, content_type="application/json")
    assert again.status_code == 409 and again.json()["error"] == "not_awaiting_approval"
    assert fake_probe.methods().count("probe.write") == 1
    command = ProbeCommand.objects.get(pk=command_id)
    assert command.approved_by == user and command.approval_hash == command.args_hash
    assert audit_actions() == ["probe.command.approved"]


def test_a_write_with_a_diff_shows_that_diff_as_its_preview(api, writable_probe, fake_probe):
    diff = "--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n"
    body = post_command(api, writable_probe.pk, "write", {"path": "/home/alice/proj/x", "diff": diff}).json()
    assert body["preview"] == diff
    assert fake_probe.calls == []


def test_a_rejected_command_never_runs(api, writable_probe, fake_probe):
    body = post_command(api, writable_probe.pk, "run", {"argv": ["rm", "-rf", "build"]}).json()
    rejected = api.post(f"/api/probes/commands/{body['id']}/reject", {}, content_type="application/json")
    assert rejected.status_code == 200
    assert rejected.json()["state"] == "rejected" and rejected.json()["error"]["code"] == "rejected"
    late = api.post(f"/api/probes/commands/{body['id']}/approve", {}, content_type="application/json")
    assert late.status_code == 409
    assert api.post(f"/api/probes/commands/{body['id']}/reject", {}).status_code == 409
    assert fake_probe.calls == []
    assert ProbeCommand.objects.get(pk=body["id"]).state == "rejected"
    assert audit_actions() == ["probe.command.rejected"]


def test_an_approval_is_for_the_arguments_the_approver_saw(api, writable_probe, fake_probe):
    first = post_command(api, writable_probe.pk, "run", {"argv": ["make", "test"]}).json()
    second = post_command(api, writable_probe.pk, "run", {"argv": ["make", "deploy"]}).json()
    assert first["args_hash"] != second["args_hash"]
    # Approving the second with the hash of the first (what the approver looked at) is refused.
    refused = api.post(f"/api/probes/commands/{second['id']}/approve", {"args_hash": first["args_hash"]},
                       content_type="application/json")
    assert refused.status_code == 409 and refused.json()["error"] == "args_changed"
    assert ProbeCommand.objects.get(pk=second["id"]).state == "awaiting_approval"
    ok = api.post(f"/api/probes/commands/{first['id']}/approve", {"args_hash": first["args_hash"], "wait": 5},
                  content_type="application/json")
    assert ok.json()["state"] == "done"
    assert fake_probe.calls == [(str(writable_probe.pk), "probe.run", {"argv": ["make", "test"]})]
    # The same arguments again are a new command and need a new approval.
    third = post_command(api, writable_probe.pk, "run", {"argv": ["make", "test"]}).json()
    assert third["state"] == "awaiting_approval"
    assert len(fake_probe.calls) == 1


def test_someone_elses_command_is_404_for_every_verb(api, other_user, fake_probe):
    theirs = make_probe(other_user, "theirs", modes=("exec",))
    other = Client()
    other.force_login(other_user)
    command_id = post_command(other, theirs.pk, "run", {"argv": ["id"]}).json()["id"]
    assert api.get(f"/api/probes/commands/{command_id}").status_code == 404
    assert api.post(f"/api/probes/commands/{command_id}/approve", {}).status_code == 404
    assert api.post(f"/api/probes/commands/{command_id}/reject", {}).status_code == 404
    assert api.get("/api/probes/approvals").json() == []
    assert ProbeCommand.objects.get(pk=command_id).state == "awaiting_approval"


def test_session_posts_need_csrf(user, writable_probe, fake_probe):
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(user)
    assert post_command(browser, writable_probe.pk, "ping", {}).status_code == 403
    assert not ProbeCommand.objects.exists()


def test_an_approval_that_waited_too_long_expires(api, writable_probe, fake_probe):
    from datetime import timedelta

    from django.utils import timezone

    body = post_command(api, writable_probe.pk, "run", {"argv": ["make"]}).json()
    ProbeCommand.objects.filter(pk=body["id"]).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert api.get("/api/probes/approvals").json() == []
    late = api.post(f"/api/probes/commands/{body['id']}/approve", {}, content_type="application/json")
    assert late.status_code == 409 and late.json()["error"] == "expired"
    assert api.get(f"/api/probes/commands/{body['id']}").json()["state"] == "expired"
    assert fake_probe.calls == []
    assert audit_actions() == ["probe.command.expired"]


# --- who may approve ----------------------------------------------------------------------------

def test_an_agents_token_cannot_approve_but_may_withdraw(client, writable_probe, token, fake_probe):
    bearer = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    first = post_command(client, writable_probe.pk, "run", {"argv": ["make"]}, **bearer).json()
    refused = client.post(f"/api/probes/commands/{first['id']}/approve", {}, content_type="application/json",
                          **bearer)
    assert refused.status_code == 403 and refused.json()["error"] == "approval_needs_a_person"
    assert ProbeCommand.objects.get(pk=first["id"]).state == "awaiting_approval"
    withdrawn = client.post(f"/api/probes/commands/{first['id']}/reject", {}, content_type="application/json",
                            **bearer)
    assert withdrawn.status_code == 200 and withdrawn.json()["state"] == "rejected"
    assert fake_probe.calls == []


def test_token_approvals_can_be_allowed_by_the_operator(client, writable_probe, token, fake_probe, settings):
    settings.PROBES_TOKEN_APPROVALS = True
    bearer = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    body = post_command(client, writable_probe.pk, "run", {"argv": ["make"]}, **bearer).json()
    done = client.post(f"/api/probes/commands/{body['id']}/approve", {"wait": 5}, content_type="application/json",
                       **bearer)
    assert done.status_code == 200 and done.json()["state"] == "done"


def test_a_session_without_its_second_factor_is_refused(api, user, writable_probe, fake_probe):
    from django_otp.plugins.otp_totp.models import TOTPDevice

    body = post_command(api, writable_probe.pk, "run", {"argv": ["make"]}).json()
    TOTPDevice.objects.create(user=user, name="phone", confirmed=True)
    for response in (api.get("/api/probes/"), api.get("/api/probes/approvals"),
                     api.post(f"/api/probes/commands/{body['id']}/approve", {}, content_type="application/json")):
        assert response.status_code == 403 and response.json()["error"] == "otp_required"
    assert api.get("/studio/").status_code == 302
    assert ProbeCommand.objects.get(pk=body["id"]).state == "awaiting_approval"


def test_a_runaway_agent_is_capped(api, writable_probe, fake_probe, monkeypatch):
    monkeypatch.setattr("probes.services.MAX_AWAITING_PER_USER", 2)
    for n in range(2):
        assert post_command(api, writable_probe.pk, "run", {"argv": ["echo", str(n)]}).status_code == 202
    capped = post_command(api, writable_probe.pk, "run", {"argv": ["echo", "2"]})
    assert capped.status_code == 429 and capped.json()["error"] == "too_many_pending"
    assert ProbeCommand.objects.count() == 2
    assert post_command(api, writable_probe.pk, "ping", {}).json()["state"] == "done"  # reads still run

    # Commands that expired, or were lost in flight, stop counting: the cap sweeps them before it refuses
    # (command_create itself sweeps only now and then).
    ProbeCommand.objects.filter(state="awaiting_approval").update(expires_at=timezone.now() - timedelta(seconds=1))
    assert post_command(api, writable_probe.pk, "run", {"argv": ["echo", "3"]}).status_code == 202
    assert ProbeCommand.objects.filter(state="expired").count() == 2
    monkeypatch.setattr("probes.services.MAX_IN_FLIGHT", 1)
    ProbeCommand.objects.create(owner=writable_probe.owner, device=writable_probe, requested_by=writable_probe.owner,
                                op="ping", args={}, args_hash="x", state="sent",
                                sent_at=timezone.now() - timedelta(hours=1))
    assert post_command(api, writable_probe.pk, "ping", {}).json()["state"] == "done"
    assert ProbeCommand.objects.get(sent_at__lt=timezone.now() - timedelta(minutes=30)).error["code"] == "lost"
