"""How a caller waits for a command's outcome in the process that ends it (probes.selectors.outcomes): the
command as its ending left it, without reading its row again, and no wake-up lost between a read and a wait."""

from __future__ import annotations

import json
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


def test_a_read_command_is_answered_as_it_ended_without_reading_its_row(client, probe, token, fake_probe, reads,
                                                                          monkeypatch):
    monkeypatch.setattr(selectors, "POLL_SEC", 5.0)  # the waiter wakes for the outcome only, not to poll
    fake_probe.answers["probe.read"] = {"content": "line 1\nline 2\n", "offset": 0, "nested": {"n": [1, 2.5, None]}}
    bearer = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    response = client.post(f"/api/probes/{probe.name}/commands", {"op": "read", "args": READ, "wait": 5},
                           content_type="application/json", **bearer)
    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["state"] == "done" and body["result"]["nested"] == {"n": [1, 2.5, None]}
    assert reads == []
    # What the waiter was handed is what the row holds; it is not kept once the waiter has it.
    stored = ProbeCommand.objects.select_related("device").get(pk=body["id"])
    assert body == json.loads(json.dumps(selectors.command_describe(stored)))
    assert stored.pk not in selectors.outcomes.final and stored.pk not in selectors.outcomes.watched
    assert body == client.get(f"/api/probes/commands/{body['id']}", **bearer).json()
    assert reads == [stored.pk]


def test_an_outcome_that_comes_before_the_wait_is_kept_for_it(client, probe, token, fake_probe, reads,
                                                               monkeypatch):
    """The send runs inline here, so the command has ended before the POST's waiter begins to wait: the view
    watched for it before writing it."""
    monkeypatch.setattr(services, "_in_background", lambda function, **kwargs: function(**kwargs))
    response = client.post(f"/api/probes/{probe.name}/commands", {"op": "read", "args": READ, "wait": 5},
                           content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 200 and response.json()["state"] == "done"
    assert reads == []


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


def test_someone_elses_ended_command_is_404_though_kept_for_waiters(user, other_user, probe, reads):
    command = ProbeCommand.objects.create(owner=user, device=probe, requested_by=user, op="read", args=READ,
                                          args_hash="x", state=ProbeCommand.State.DONE, result={"content": "x"})
    with selectors.command_watched(command.pk):
        selectors.outcomes.publish(command)
        assert selectors.command_wait(user=user, command_id=command.pk, wait=0) is command
        assert reads == []
        with pytest.raises(NotFound):
            selectors.command_wait(user=other_user, command_id=command.pk, wait=0)


def test_an_outcome_is_kept_only_while_a_waiter_here_watches_it(user, probe):
    """Results may be 4 MiB each: none is held for nobody."""
    outcomes = selectors.Outcomes()
    ended = [ProbeCommand(owner=user, device=probe, op="read", args=READ, state=ProbeCommand.State.DONE)
             for _ in range(3)]
    outcomes.publish(ended[0])  # nobody watches it
    with outcomes.watching(ended[1].pk):
        with outcomes.watching(ended[1].pk):  # two waiters
            outcomes.publish(ended[1])
            outcomes.publish(ProbeCommand(owner=user, device=probe, op="read", args=READ,
                                          state=ProbeCommand.State.SENT))  # not ended: never kept
        assert list(outcomes.final) == [ended[1].pk]  # one waiter left
    assert outcomes.final == {} and outcomes.watched == {}


def test_a_stored_outcome_that_fails_leaves_the_command_as_its_row(user, probe, fake_probe, monkeypatch):
    """The outcome's write fails (here: a room post that breaks the transaction's commit is simulated by an
    UPDATE that raises once): the command handed to waiters says failed, as the row does."""
    from django.db import DatabaseError

    from ai1net import sql

    command = services.command_create(user=user, device=probe, op="read", args=READ)
    assert services.background_join(10)
    ProbeCommand.objects.filter(pk=command.pk).update(state=ProbeCommand.State.SENT, result=None, error=None,
                                                      finished_at=None)
    command = ProbeCommand.objects.select_related("device", "owner").get(pk=command.pk)
    real_update, failed = sql.update_by, []

    def update_once_failing(model, values, **where):
        if not failed and values.get("state") == ProbeCommand.State.DONE:
            failed.append(True)
            raise DatabaseError("disk full")
        return real_update(model, values, **where)

    monkeypatch.setattr(sql, "update_by", update_once_failing)
    with selectors.command_watched(command.pk):
        services._finish(command, state=ProbeCommand.State.DONE, result={"content": "x"})
        assert selectors.outcomes.final[command.pk] is command
    stored = ProbeCommand.objects.get(pk=command.pk)
    assert failed and stored.state == command.state == ProbeCommand.State.FAILED
    assert stored.error == command.error and stored.error["code"] == "internal_error"
    assert stored.result is command.result is None and stored.finished_at == command.finished_at
