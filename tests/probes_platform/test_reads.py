"""The reads every agent request makes, as statements written once (ai1net.sql): the same rows the ORM reads."""

from __future__ import annotations

import pytest

from ai1net import sql
from ai1net.exceptions import NotFound
from devices.models import Device
from probes import selectors, services
from probes.models import ProbeCommand
from tests.probes_platform.conftest import make_probe

pytestmark = pytest.mark.django_db


def fields(obj) -> list:
    return [getattr(obj, f.attname) for f in type(obj)._meta.concrete_fields]


def test_some_by_reads_up_to_its_limit_what_the_orm_reads(user):
    probes = [make_probe(user, "box") for _ in range(3)]
    got = sql.some_by(Device, 2, owner=user, kind=Device.Kind.PROBE, name="box")
    assert len(got) == 2 and {d.pk for d in got} <= {p.pk for p in probes}
    for device in got:
        assert fields(device) == fields(Device.objects.get(pk=device.pk))
    assert len(sql.some_by(Device, 5, owner=user, name="box")) == 3
    assert sql.some_by(Device, 2, owner=user, name="nothing") == []


def test_a_probe_is_found_by_id_or_name_in_one_statement_and_namesakes_in_order(
        user, other_user, django_assert_num_queries):
    probe = make_probe(user, "laptop")
    with django_assert_num_queries(1):
        assert selectors.probe_access(user=user, probe=str(probe.pk)).pk == probe.pk
    with django_assert_num_queries(1):
        assert fields(selectors.probe_access(user=user, probe="laptop")) == fields(probe)
    make_probe(user, "box", online=False)
    live = make_probe(user, "box", online=True)
    with django_assert_num_queries(2):  # two read without order, then the ordered read
        assert selectors.probe_access(user=user, probe="box").pk == live.pk
    make_probe(user, "gone", status=Device.Status.REVOKED)
    theirs = make_probe(other_user, "theirs")
    for name in ("gone", "theirs", str(theirs.pk), "nothing"):
        with pytest.raises(NotFound):
            selectors.probe_access(user=user, probe=name)


def test_the_in_flight_count_is_the_orms(user):
    probe, other = make_probe(user, "a"), make_probe(user, "b")
    for device, state in [(probe, "approved"), (probe, "sent"), (probe, "done"), (probe, "awaiting_approval"),
                          (other, "sent")]:
        ProbeCommand.objects.create(owner=user, device=device, requested_by=user, op="read", args={},
                                    args_hash="x", state=state)
    assert services._in_flight_count(probe) == 2 == ProbeCommand.objects.filter(
        device=probe, state__in=["approved", "sent"]).count()


def test_update_by_writes_what_the_orms_update_writes(user):
    from django.utils import timezone

    probe = make_probe(user, "a")
    command = ProbeCommand.objects.create(owner=user, device=probe, requested_by=user, op="read", args={},
                                          args_hash="x", state="sent", error={"code": "old"})
    now = timezone.now()
    outcome = {"state": "done", "result": {"lines": ["x", None, 2.5]}, "error": None, "finished_at": now}
    assert sql.update_by(ProbeCommand, outcome, id=command.pk, state="sent") == 1
    assert sql.update_by(ProbeCommand, outcome, id=command.pk, state="sent") == 0  # the condition holds no more
    command.refresh_from_db()
    assert (command.state, command.result, command.error, command.finished_at) == (
        "done", {"lines": ["x", None, 2.5]}, None, now)
    assert ProbeCommand.objects.filter(pk=command.pk, error__isnull=True).exists()  # SQL NULL, as update() writes
    assert sql.update_by(ProbeCommand, {"device": make_probe(user, "b")}, id=command.pk) == 1
    assert ProbeCommand.objects.get(pk=command.pk).device.name == "b"
