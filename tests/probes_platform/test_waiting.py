"""How a caller waits for a command's outcome in the process that ends it (probes.selectors.outcomes): the
command as its ending left it, without reading its row again, and no wake-up lost between a read and a wait."""

from __future__ import annotations

import time

import pytest

from ai1net.exceptions import NotFound
from probes import selectors, services
from probes.models import ProbeCommand

pytestmark = pytest.mark.django_db(transaction=True)

READ = {"path": "/home/alice/proj/a.py", "offset": 0, "limit": 2}


@pytest.fixture
def reads(monkeypatch):
    """Counts the waiters' reads of a command's row."""
    calls: list[object] = []
    real = selectors.command_access

    def counted(**kwargs):
        calls.append(kwargs["command_id"])
        return real(**kwargs)

    monkeypatch.setattr(selectors, "command_access", counted)
    return calls


def test_a_read_command_is_answered_as_it_ended_without_reading_its_row(client, probe, token, fake_probe, reads):
    fake_probe.answers["probe.read"] = {"content": "line 1\nline 2\n", "offset": 0, "nested": {"n": [1, 2.5, None]}}
    bearer = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    response = client.post(f"/api/probes/{probe.name}/commands", {"op": "read", "args": READ, "wait": 5},
                           content_type="application/json", **bearer)
    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["state"] == "done" and body["result"]["nested"] == {"n": [1, 2.5, None]}
    assert reads == []
    # What the waiter was handed is what the row holds.
    stored = ProbeCommand.objects.select_related("device").get(pk=body["id"])
    assert selectors.command_describe(stored) == selectors.command_describe(selectors.outcomes.final[stored.pk])
    assert body == client.get(f"/api/probes/commands/{body['id']}", **bearer).json()


def test_a_command_that_ended_elsewhere_is_read(api, user, probe, reads):
    command = ProbeCommand.objects.create(owner=user, device=probe, requested_by=user, op="read", args=READ,
                                          args_hash="x", state=ProbeCommand.State.DONE, result={"content": ""})
    response = api.get(f"/api/probes/commands/{command.pk}?wait=1")
    assert response.status_code == 200 and response.json()["state"] == "done"
    assert reads == [command.pk]


def test_an_outcome_between_a_waiters_read_and_its_wait_wakes_it_at_once(user, probe):
    command = ProbeCommand.objects.create(owner=user, device=probe, requested_by=user, op="read", args=READ,
                                          args_hash="x", state=ProbeCommand.State.SENT)
    mark = selectors.outcomes.mark()
    stale = ProbeCommand.objects.get(pk=command.pk)  # the waiter's read: still sent
    ProbeCommand.objects.filter(pk=command.pk).update(state=ProbeCommand.State.DONE, result={"content": "x"})
    command.refresh_from_db()
    selectors.outcomes.publish(command)  # ... before the waiter waits
    started = time.monotonic()
    ended = selectors.command_wait(user=user, command_id=command.pk, wait=5, first=stale, since=mark)
    assert ended.state == ProbeCommand.State.DONE
    assert time.monotonic() - started < selectors.POLL_SEC / 2  # a plain condition slept POLL_SEC here
    # Without a change since its mark, a waiter does wait.
    started = time.monotonic()
    selectors.outcomes.wait(selectors.outcomes.mark(), 0.3)
    assert time.monotonic() - started >= 0.25


def test_someone_elses_ended_command_is_404_though_kept_for_waiters(user, other_user, probe):
    command = ProbeCommand.objects.create(owner=user, device=probe, requested_by=user, op="read", args=READ,
                                          args_hash="x", state=ProbeCommand.State.DONE, result={"content": "x"})
    selectors.outcomes.publish(command)
    assert selectors.command_wait(user=user, command_id=command.pk, wait=0).pk == command.pk
    with pytest.raises(NotFound):
        selectors.command_wait(user=other_user, command_id=command.pk, wait=0)


def test_only_the_last_ended_commands_are_kept(user, probe):
    outcomes = selectors.Outcomes()
    commands = [ProbeCommand(owner=user, device=probe, op="read", args=READ, state=ProbeCommand.State.DONE)
                for _ in range(selectors.Outcomes.KEEP + 10)]
    for command in commands:
        outcomes.publish(command)
    outcomes.publish(ProbeCommand(owner=user, device=probe, op="read", args=READ, state=ProbeCommand.State.SENT))
    assert list(outcomes.final) == [c.pk for c in commands[10:]]  # the oldest gone; one not ended never kept


def test_a_stored_outcome_that_fails_leaves_the_command_as_its_row(user, probe, fake_probe, monkeypatch):
    """The outcome's write fails (here: a room post that breaks the transaction's commit is simulated by an
    UPDATE that raises once): the command handed to waiters says failed, as the row does."""
    from django.db import DatabaseError
    from django.db.models import QuerySet

    command = services.command_create(user=user, device=probe, op="read", args=READ)
    assert services.background_join(10)
    ProbeCommand.objects.filter(pk=command.pk).update(state=ProbeCommand.State.SENT, result=None, error=None,
                                                      finished_at=None)
    command = ProbeCommand.objects.select_related("device", "owner").get(pk=command.pk)
    real_update, failed = QuerySet.update, []

    def update_once_failing(self, **kwargs):
        if not failed and kwargs.get("state") == ProbeCommand.State.DONE:
            failed.append(True)
            raise DatabaseError("disk full")
        return real_update(self, **kwargs)

    monkeypatch.setattr(QuerySet, "update", update_once_failing)
    services._finish(command, state=ProbeCommand.State.DONE, result={"content": "x"})
    stored = ProbeCommand.objects.get(pk=command.pk)
    assert failed and stored.state == command.state == ProbeCommand.State.FAILED
    assert stored.error == command.error and stored.error["code"] == "internal_error"
    assert stored.result is command.result is None and stored.finished_at == command.finished_at
    assert selectors.outcomes.final[command.pk] is command
