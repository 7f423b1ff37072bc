from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db.models import Case, IntegerField, QuerySet, Value, When
from django.utils import timezone

from ai1net import sql
from ai1net.exceptions import NotFound
from devices.models import Device
from probes.models import ProbeCommand
from probes.ops import probe_modes

POLL_SEC = 0.2


class Outcomes:
    """What this process's services changed in commands, for the waiters here (``command_wait``); changes
    made in other processes are seen by re-reading the row every POLL_SEC.

    - A count of changes, read by a waiter before it reads the row: a change between its read and its wait
      wakes it at once (a bare condition's notify came before the wait, and the waiter slept POLL_SEC).
    - The commands that end here while a waiter here watches them, as their ending left them: the waiter takes
      its command from there and does not read it again (a read command's two reads of its row were 15% of
      daphne's busy samples under bench/probe.py). A final command never changes again, so what is kept stays
      true; it is dropped when its last waiter leaves, so no more results are held than waiters are answering
      (each may be up to 4 MiB).
    """

    def __init__(self) -> None:
        self.changed = threading.Condition()
        self.count = 0
        self.watched: dict[uuid.UUID, int] = {}  # command id -> waiters watching it
        self.final: dict[uuid.UUID, ProbeCommand] = {}

    def mark(self) -> int:
        with self.changed:
            return self.count

    @contextmanager
    def watching(self, key: uuid.UUID) -> Iterator[None]:
        with self.changed:
            self.watched[key] = self.watched.get(key, 0) + 1
        try:
            yield
        finally:
            with self.changed:
                left = self.watched.pop(key) - 1
                if left:
                    self.watched[key] = left
                else:
                    self.final.pop(key, None)

    def publish(self, command: ProbeCommand | None = None) -> None:
        """Commands changed (``command``, when one did and the caller holds it as it is now)."""
        with self.changed:
            self.count += 1
            if command is not None and command.is_final and command.pk in self.watched:
                self.final[command.pk] = command
            self.changed.notify_all()

    def final_here(self, *, user: Any, key: uuid.UUID) -> ProbeCommand | None:
        with self.changed:
            command = self.final.get(key)
        return command if command is not None and command.owner_id == user.pk else None

    def wait(self, mark: int, timeout: float) -> None:
        """Until a change after ``mark``, or ``timeout`` seconds."""
        with self.changed:
            if self.count == mark:
                self.changed.wait(timeout)


outcomes = Outcomes()


def probes_for_user(*, user: Any) -> QuerySet[Device]:
    """The user's active probes, online ones first, then the most recently seen."""
    return (
        Device.objects.filter(owner=user, kind=Device.Kind.PROBE, status=Device.Status.ACTIVE)
        .annotate(_offline=Case(When(channel_name="", then=Value(1)), default=Value(0), output_field=IntegerField()))
        .order_by("_offline", "-last_seen_at", "-created_at")
    )


def probe_access(*, user: Any, probe: str) -> Device:
    """`probe` is the device id or its name. On a name shared by several active probes, the most recent
    online one wins. Someone else's, revoked or unknown → 404."""
    try:
        key = uuid.UUID(str(probe))
    except ValueError:
        device = None
    else:  # statements written once (sql): every agent's request asks, and Django compiled each anew
        device = sql.one_by(Device, owner=user, kind=Device.Kind.PROBE, status=Device.Status.ACTIVE, id=key)
    if device is None:
        # Most names name one probe: up to two are read without the order, which only namesakes need.
        named = sql.some_by(Device, 2, owner=user, kind=Device.Kind.PROBE, status=Device.Status.ACTIVE, name=probe)
        if len(named) == 1:
            device = named[0]
        elif named:
            device = probes_for_user(user=user).filter(name=probe).first()
    if device is None:
        raise NotFound("No such probe.", code="probe_not_found")
    return device


def probe_describe(device: Device) -> dict[str, Any]:
    return {
        "id": str(device.id),
        "name": device.name,
        "online": device.is_online,
        "hostname": device.hostname,
        "os": device.os,
        "version": device.client_version,
        "roots": device.roots if isinstance(device.roots, list) else [],
        "modes": sorted(probe_modes(device.capabilities)),
        "last_seen_at": device.last_seen_at.isoformat() if device.last_seen_at else None,
    }


def _command_key(command_id: Any) -> uuid.UUID:
    try:
        return uuid.UUID(str(command_id))
    except ValueError:
        raise NotFound("No such command.", code="command_not_found") from None


def command_access(*, user: Any, command_id: Any) -> ProbeCommand:
    command = ProbeCommand.objects.select_related("device").filter(pk=_command_key(command_id), owner=user).first()
    if command is None:
        raise NotFound("No such command.", code="command_not_found")
    return command


def commands_for_probe(*, user: Any, device: Device, limit: int = 50) -> list[ProbeCommand]:
    rows = ProbeCommand.objects.select_related("device").filter(owner=user, device=device)[:limit]
    return list(reversed(rows))  # oldest first, like a conversation


def approvals_for_user(*, user: Any) -> QuerySet[ProbeCommand]:
    return (
        ProbeCommand.objects.select_related("device")
        .filter(owner=user, state=ProbeCommand.State.AWAITING_APPROVAL, expires_at__gt=timezone.now())
        .order_by("created_at")
    )


@contextmanager
def command_watched(command_id: Any) -> Iterator[int]:
    """While inside, an outcome of the command in this process is kept for its ``command_wait`` (a caller
    that writes the command enters first, so an outcome that comes at once is not missed). Yields the
    outcomes' mark, the ``since`` of that wait."""
    with outcomes.watching(_command_key(command_id)):
        yield outcomes.mark()


def command_wait(*, user: Any, command_id: Any, wait: float, through_approval: bool = False,
                 first: ProbeCommand | None = None, since: int = 0) -> ProbeCommand:
    """Re-read the command until it is final or `wait` seconds pass. A command awaiting approval
    returns at once unless `through_approval` (the agent long-polls for the user's decision).

    ``first``: the command as the caller has just written it, with ``since`` the ``outcomes.mark()`` taken
    before the write; it is not read again until something changes."""
    key = _command_key(command_id)
    deadline = time.monotonic() + max(0.0, wait)
    command, mark = first, since
    with outcomes.watching(key):
        while True:
            if command is None:
                mark = outcomes.mark()
                command = outcomes.final_here(user=user, key=key) or command_access(user=user, command_id=key)
            if command.is_final:
                return command
            if command.state == ProbeCommand.State.AWAITING_APPROVAL and not through_approval:
                return command
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return command
            outcomes.wait(mark, min(POLL_SEC, remaining))
            command = None


def command_describe(command: ProbeCommand) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": str(command.id),
        "probe": {"id": str(command.device_id), "name": command.device.name},
        "op": command.op,
        "args": command.args,
        "args_hash": command.args_hash,
        "state": command.state,
        "via": command.via,
        "created_at": command.created_at.isoformat(),
        "expires_at": command.expires_at.isoformat() if command.expires_at else None,
        "approved_at": command.approved_at.isoformat() if command.approved_at else None,
        "sent_at": command.sent_at.isoformat() if command.sent_at else None,
        "finished_at": command.finished_at.isoformat() if command.finished_at else None,
    }
    if command.preview:
        body["preview"] = command.preview
    if command.state == ProbeCommand.State.DONE:
        body["result"] = command.result
    elif command.error:
        body["error"] = command.error
    return body
