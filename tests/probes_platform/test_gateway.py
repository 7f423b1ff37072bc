"""Gateway invariants below the API: single-use approvals, no replay, the room sees results,
in-flight commands fail when the probe goes away."""

from __future__ import annotations

import pytest

from devices.models import Device
from devices.signals import device_disconnected
from im.models import Message, Room
from probes import services
from probes.models import ProbeCommand
from tests.e2e_support import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def approved_command(user, device, op="run", args=None) -> ProbeCommand:
    command = services.command_create(user=user, device=device, op=op, args=args or {"argv": ["make"]})
    assert command.state == "awaiting_approval"
    ProbeCommand.objects.filter(pk=command.pk).update(state="approved", approval_hash=command.args_hash)
    return command


def test_an_approval_is_consumed_once(user, writable_probe, fake_probe):
    command = approved_command(user, writable_probe)
    assert services.command_send(command_id=command.pk).state == "done"
    # A second send (a retry, a reconnect, another process) finds nothing to consume.
    assert services.command_send(command_id=command.pk) is None
    assert fake_probe.methods() == ["probe.run"]


def test_arguments_changed_after_approval_are_never_sent(user, writable_probe, fake_probe):
    from probes.ops import args_hash

    # A changed argument comes with its own hash: the approval (bound to the old hash) does not apply.
    command = approved_command(user, writable_probe, args={"argv": ["make", "test"]})
    evil = {"argv": ["rm", "-rf", "/"]}
    ProbeCommand.objects.filter(pk=command.pk).update(args=evil, args_hash=args_hash("run", evil))
    assert services.command_send(command_id=command.pk) is None
    assert ProbeCommand.objects.get(pk=command.pk).state == "approved"
    # The arguments edited behind the hash's back: the recomputed hash differs, refused and recorded.
    other = approved_command(user, writable_probe, args={"argv": ["make", "test"]})
    ProbeCommand.objects.filter(pk=other.pk).update(args=evil)
    refused = services.command_send(command_id=other.pk)
    assert refused.state == "failed" and refused.error["code"] == "approval_mismatch"
    assert fake_probe.calls == []


def test_a_disconnect_fails_what_was_sent_and_nothing_is_resent(user, writable_probe, fake_probe):
    def hang(params):
        assert fake_probe.gate.wait(10)
        return {"exit_code": 0}

    fake_probe.answers["probe.run"] = hang
    command = approved_command(user, writable_probe)
    services._in_background(services.command_send, command_id=command.pk)
    wait_until(lambda: ProbeCommand.objects.get(pk=command.pk).state == "sent", 5)
    device_disconnected.send(sender=Device, device=writable_probe)
    command.refresh_from_db()
    assert command.state == "failed" and command.error["code"] == "device_offline"
    fake_probe.gate.set()  # the late answer does not overwrite the first outcome
    assert services.background_join(5)
    command.refresh_from_db()
    assert command.state == "failed" and command.result is None
    assert services.command_send(command_id=command.pk) is None
    assert fake_probe.methods() == ["probe.run"]


def test_results_and_decisions_are_posted_into_the_probes_studio_room(api, user, writable_probe, fake_probe):
    fake_probe.answers["probe.grep"] = {"matches": [{"path": "a.py", "line": 3, "text": "# TODO"}]}
    api.post(f"/api/probes/{writable_probe.pk}/commands", {"op": "grep", "args": {"pattern": "TODO"}, "wait": 5},
             content_type="application/json")
    run = api.post(f"/api/probes/{writable_probe.pk}/commands", {"op": "run", "args": {"argv": ["make"]}},
                   content_type="application/json").json()
    api.post(f"/api/probes/commands/{run['id']}/reject", {}, content_type="application/json")
    room = Room.objects.get(kind=Room.Kind.STUDIO, owner=user, device=writable_probe)
    texts = [m.body["text"] for m in Message.objects.filter(room=room).order_by("seq")]
    assert texts[0].startswith("✔ grep TODO") and "# TODO" in texts[0]
    assert texts[1] == "… run make: waiting for your approval"
    assert texts[2] == "✘ skipped by alice: run make"
    detail = api.get(f"/api/probes/{writable_probe.pk}").json()
    assert detail["room_id"] == str(room.pk)


def test_stale_commands_are_swept_and_never_sent_late(user, writable_probe, fake_probe):
    from datetime import timedelta

    from django.utils import timezone

    stuck = approved_command(user, writable_probe)
    waiting = services.command_create(user=user, device=writable_probe, op="run", args={"argv": ["ls"]})
    fresh = services.command_create(user=user, device=writable_probe, op="run", args={"argv": ["pwd"]})
    ProbeCommand.objects.filter(pk=stuck.pk).update(approved_at=timezone.now() - timedelta(minutes=6))
    ProbeCommand.objects.filter(pk=waiting.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert services.commands_expire() == 2
    assert ProbeCommand.objects.get(pk=stuck.pk).error["code"] == "lost"
    assert ProbeCommand.objects.get(pk=waiting.pk).state == "expired"
    assert ProbeCommand.objects.get(pk=fresh.pk).state == "awaiting_approval"
    assert services.command_send(command_id=stuck.pk) is None
    assert fake_probe.calls == []


def test_output_with_nul_bytes_is_stored_on_every_database(user, writable_probe, fake_probe):
    fake_probe.answers["probe.run"] = {"exit_code": 0, "stdout": "a\x00b", "stderr": ""}
    command = approved_command(user, writable_probe)
    assert services.command_send(command_id=command.pk).state == "done"
    assert ProbeCommand.objects.get(pk=command.pk).result["stdout"] == "a\ufffdb"
