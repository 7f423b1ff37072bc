"""The authorization gateway: every probe command is a record that moves
awaiting_approval → approved | rejected → sent → done | failed (or expired).

Reads are approved by policy and sent at once; write / run / run_background / stop wait for the
owner, whose approval is bound to the hash of the exact arguments and consumed by ONE conditional
UPDATE approved → sent, so it is used once and never replayed (a reconnect never re-sends a `sent`
command). The device call runs in a background thread that records the result in the row; HTTP
callers wait on the row (selectors.command_wait), never on the call itself.
"""

from __future__ import annotations

import asyncio
import difflib
import functools
import json
import logging
import os
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

from asgiref.sync import SyncToAsync, sync_to_async
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import DatabaseError, close_old_connections, connections, router, transaction
from django.db.models import F
from django.utils import timezone

from ai1net import sql
from ai1net.exceptions import ApplicationError, Conflict, RateLimited
from clients import limits
from devices.models import Device
from probes import selectors
from probes.models import APPROVAL_OPS, ProbeCommand
from probes.ops import args_hash, probe_modes, required_mode, validate

logger = logging.getLogger(__name__)
State = ProbeCommand.State

APPROVAL_TTL = timedelta(seconds=settings.PROBES_APPROVAL_TTL_SEC)
CALL_TIMEOUT_SEC = float(getattr(settings, "PROBES_CALL_TIMEOUT_SEC", 60))
MAX_CALL_TIMEOUT_SEC = float(getattr(settings, "PROBES_MAX_CALL_TIMEOUT_SEC", 15 * 60))
ROOM_RESULT_CHARS = 16_000  # what a room message carries of a result; the full result stays in the row
PREVIEW_CHARS = 200_000
NOT_FOUND_CODES = frozenset({"not_found", "file_not_found", "no_such_file", "ENOENT"})
PROBE_REFUSALS = frozenset({"outside_allowed_roots", "not_permitted"})  # the probe's own refusals, audited
LOST_AFTER_APPROVAL = timedelta(minutes=5)  # approved but never sent (the process died in between)
RUN_DEFAULT_TIMEOUT_SEC = 60  # the probe's default for `run`
MAX_AWAITING_PER_USER = 50
MAX_IN_FLIGHT = 16  # per probe: approved or sent, not yet answered


# --- seams to the other apps (imported late: tests replace them, and the apps import each other) ---

def device_call(*, device: Device, method: str, params: dict, timeout: float) -> dict:
    from devices.services import device_call as call

    return call(device=device, method=method, params=params, timeout=timeout)


def audit_record(*, actor: Any, action: str, subject: Any = None, data: dict, ip: str | None = None) -> None:
    from ai1net.accounts.services import audit_record as record

    record(actor=actor, action=action, subject=subject, data=data, ip=ip)


def room_post(*, command: ProbeCommand, text: str) -> None:
    """Post into the probe's Studio room so the conversation sees it. Never fails the command."""
    try:
        from im.services import message_post, room_get_or_create_studio

        body = {"text": text, "probe_command": str(command.pk), "op": command.op, "state": command.state}
        with transaction.atomic():  # a savepoint: a failed post never undoes the caller's transaction
            room = room_get_or_create_studio(user=command.owner, device=command.device)
            message_post(room=room, author_device=command.device, kind="event", body=body)
    except Exception:
        logger.exception("could not post probe command %s into its Studio room", command.pk)


# --- commands ---------------------------------------------------------------------------------

def command_create(*, user: Any, device: Device, op: Any, args: Any, via: str = ProbeCommand.Via.API,
                   ip: str | None = None, command_id: uuid.UUID | None = None) -> ProbeCommand:
    """``command_id``: the new command's id, when the caller watches for its outcome before it exists
    (``selectors.command_watched``); else a new one."""
    op, args = validate(op, args)
    if device.owner_id != user.pk or device.kind != Device.Kind.PROBE:
        raise ApplicationError("No such probe.", code="probe_not_found", status=404)
    _sweep_now_and_then()
    _check_capacity(user=user, device=device, op=op)
    now = timezone.now()
    fields: dict[str, Any] = {
        "id": command_id or uuid.uuid4(), "owner": user, "device": device, "requested_by": user, "via": via,
        "op": op, "args": args, "args_hash": args_hash(op, args),
    }
    mode = required_mode(op)
    if mode and mode not in probe_modes(device.capabilities):
        # Refuse early: asking the owner to approve what the probe will refuse anyway helps nobody.
        error = {"code": "not_permitted", "detail": f"This probe was not started with --{mode}; {op} is not permitted."}
        with transaction.atomic():
            command = ProbeCommand.objects.create(**fields, state=State.FAILED, error=error, finished_at=now)
            _audit(command, actor=user, action="probe.command.refused", ip=ip, code="not_permitted")
        room_post(command=command, text=_summary(command))
        return command
    if op in APPROVAL_OPS:
        with transaction.atomic():
            command = ProbeCommand.objects.create(
                **fields, state=State.AWAITING_APPROVAL, expires_at=now + APPROVAL_TTL,
                preview=args.get("diff", "") if op == "write" else "",
            )
            if op == "write" and "content" in args:
                transaction.on_commit(lambda: _in_background(command_preview_build, command_id=command.pk))
        room_post(command=command, text=_summary(command))
        return command
    with transaction.atomic():
        # Reads are approved by policy: the same single-use transition below sends them.
        command = ProbeCommand.objects.create(
            **fields, state=State.APPROVED, approval_hash=fields["args_hash"], approved_at=now
        )
        transaction.on_commit(lambda: _in_background(command_send, command_id=command.pk, device=device, owner=user))
    return command


def _check_capacity(*, user: Any, device: Device, op: str) -> None:
    """Soft caps (counted, not locked) so a runaway agent cannot flood the owner or the probe. Commands that
    expired or were lost do not count: a count at a cap sweeps them (``commands_expire``) and counts again."""
    def awaiting_full() -> bool:
        return op in APPROVAL_OPS and ProbeCommand.objects.filter(
            owner=user, state=State.AWAITING_APPROVAL).count() >= MAX_AWAITING_PER_USER

    def in_flight_full() -> bool:
        return _in_flight_count(device) >= MAX_IN_FLIGHT

    if awaiting_full() or in_flight_full():
        commands_expire()  # then count again
    if awaiting_full():
        raise RateLimited(f"{MAX_AWAITING_PER_USER} commands already wait for approval; decide on those first.",
                          code="too_many_pending")
    if in_flight_full():
        raise RateLimited(f"{MAX_IN_FLIGHT} commands are already running on this probe; wait for some to end.",
                          code="too_many_in_flight")


def _in_flight_count(device: Device) -> int:
    """``ProbeCommand.objects.filter(device=device, state__in=[approved, sent]).count()`` as a statement
    written once: every command an agent makes counts, and Django compiled the count anew each time."""
    conn = connections[router.db_for_read(ProbeCommand)]
    with conn.cursor() as cursor:
        cursor.execute(_in_flight_sql(conn.vendor), [
            ProbeCommand._meta.get_field("device").get_db_prep_value(device.pk, conn), State.APPROVED, State.SENT])
        return cursor.fetchone()[0]


@functools.cache
def _in_flight_sql(vendor: str) -> str:
    conn = connections[router.db_for_read(ProbeCommand)]
    meta, qn = ProbeCommand._meta, conn.ops.quote_name
    # Names from the model's _meta, values as parameters.
    return (f"SELECT COUNT(*) FROM {qn(meta.db_table)} WHERE {qn(meta.get_field('device').column)} = %s "  # noqa: S608
            f"AND {qn(meta.get_field('state').column)} IN (%s, %s)")


_SWEEP_EVERY_SEC = 30.0
_last_sweep = float("-inf")


def _sweep_now_and_then() -> None:
    """``commands_expire`` from command_create at most every ``_SWEEP_EVERY_SEC`` in this process: its three
    statements ran on every command an agent made. Nothing waits on it: an approval checks its own expiry,
    a cap sweeps before it refuses, and the approvals list sweeps as before."""
    global _last_sweep
    now = time.monotonic()
    if now - _last_sweep < _SWEEP_EVERY_SEC:
        return
    _last_sweep = now
    commands_expire()


def command_approve(*, user: Any, command_id: Any, seen_hash: str | None = None,
                    ip: str | None = None) -> ProbeCommand:
    """The owner approves exactly these arguments. `seen_hash` (optional) is the args_hash the
    approver was shown: if it differs, the approval is refused."""
    command = selectors.command_access(user=user, command_id=command_id)
    if seen_hash is not None and seen_hash != command.args_hash:
        raise Conflict("These are not the arguments you were shown; review the command again.",
                       code="args_changed")
    commands_expire()
    now = timezone.now()
    with transaction.atomic():
        updated = ProbeCommand.objects.filter(
            pk=command.pk, owner=user, state=State.AWAITING_APPROVAL, expires_at__gt=now,
        ).update(state=State.APPROVED, approval_hash=F("args_hash"), approved_by=user, approved_at=now)
        if not updated:
            command.refresh_from_db()
            code = "expired" if command.state == State.EXPIRED else "not_awaiting_approval"
            raise Conflict(f"This command is {command.state.replace('_', ' ')}, not awaiting approval.", code=code)
        _audit(command, actor=user, action="probe.command.approved", ip=ip)
        transaction.on_commit(lambda: _in_background(command_send, command_id=command.pk, device=command.device,
                                                     owner=user))
    command.refresh_from_db()
    room_post(command=command, text=f"✔ approved by {user.get_username()}: {_request_line(command)}")
    return command


def command_reject(*, user: Any, command_id: Any, ip: str | None = None) -> ProbeCommand:
    command = selectors.command_access(user=user, command_id=command_id)
    now = timezone.now()
    with transaction.atomic():
        updated = ProbeCommand.objects.filter(pk=command.pk, owner=user, state=State.AWAITING_APPROVAL).update(
            state=State.REJECTED, finished_at=now,
            error={"code": "rejected", "detail": f"Skipped by {user.get_username()}."},
        )
        if not updated:
            command.refresh_from_db()
            raise Conflict(f"This command is {command.state.replace('_', ' ')}, not awaiting approval.",
                           code="not_awaiting_approval")
        _audit(command, actor=user, action="probe.command.rejected", ip=ip)
    command.refresh_from_db()
    selectors.outcomes.publish(command)
    room_post(command=command, text=f"✘ skipped by {user.get_username()}: {_request_line(command)}")
    return command


def command_send(*, command_id: Any, device: Device | None = None, owner: Any = None) -> ProbeCommand | None:
    """Consume the approval (approved → sent, once) and call the probe. Returns None when another
    caller consumed it first or the command is no longer approved.

    ``device`` and ``owner``: the command's, as the caller that approved it holds them (else read)."""
    now = timezone.now()
    consumed = ProbeCommand.objects.filter(
        pk=command_id, state=State.APPROVED, approval_hash=F("args_hash")
    ).update(state=State.SENT, sent_at=now)
    if not consumed:
        return None
    # The row as it is now, by a statement written once (the joined ORM read was compiled on every command).
    command = sql.one_by(ProbeCommand, id=command_id)
    if command is None:  # deleted with its probe meanwhile
        return None
    command.device = device if device is not None and device.pk == command.device_id else (
        Device.objects.get(pk=command.device_id))
    command.owner = owner if owner is not None and owner.pk == command.owner_id else (
        get_user_model().objects.get(pk=command.owner_id))
    if args_hash(command.op, command.args) != command.approval_hash:
        # The stored arguments are not what was approved (the row changed): never send them.
        _finish(command, state=State.FAILED,
                error={"code": "approval_mismatch", "detail": "The arguments differ from the approved ones."})
        _audit(command, actor=command.owner, action="probe.command.refused", code="approval_mismatch")
        return command
    try:
        result = device_call(device=command.device, method=f"probe.{command.op}", params=command.args,
                             timeout=_call_timeout(command))
    except ApplicationError as exc:
        if exc.code in PROBE_REFUSALS:  # recorded before anyone can see the outcome
            _audit(command, actor=command.owner, action="probe.command.refused", code=exc.code)
        _finish(command, state=State.FAILED, error={"code": exc.code, "detail": exc.detail})
    except Exception:
        logger.exception("probe command %s failed", command.pk)
        _finish(command, state=State.FAILED, error={"code": "internal_error", "detail": "The platform failed."})
    else:
        _finish(command, state=State.DONE, result=result)
    return command


def command_preview_build(*, command_id: Any) -> None:
    """Before the owner approves a write with full content, show the diff against the file as it is now."""
    command = ProbeCommand.objects.select_related("device").filter(
        pk=command_id, op="write", state=State.AWAITING_APPROVAL
    ).first()
    if command is None or "content" not in command.args:
        return
    path = command.args["path"]
    note = "(no preview: the current file could not be shown as text)"
    try:
        current = _read_whole(command.device, path)
    except ApplicationError as exc:
        current = "" if exc.code in NOT_FOUND_CODES else None  # a new file diffs against nothing
        note = f"(no preview: {exc.code}: {exc.detail})"
    if current is None:
        preview = note
    else:
        new = command.args["content"]
        preview = "".join(difflib.unified_diff(
            current.splitlines(keepends=True), new.splitlines(keepends=True),
            fromfile=f"a/{path.lstrip('/')}" if current else "/dev/null", tofile=f"b/{path.lstrip('/')}",
        )) or "(no change)"
    ProbeCommand.objects.filter(pk=command.pk, state=State.AWAITING_APPROVAL).update(
        preview=_without_nul(preview[:PREVIEW_CHARS])
    )
    selectors.outcomes.publish()


def commands_expire(*, now: Any = None) -> int:
    """Approvals that waited too long expire; commands lost in `sent` (a process died mid-call) fail."""
    now = now or timezone.now()
    stale = list(ProbeCommand.objects.filter(state=State.AWAITING_APPROVAL, expires_at__lte=now)
                 .select_related("owner")[:200])
    count = 0
    for command in stale:
        with transaction.atomic():
            if ProbeCommand.objects.filter(pk=command.pk, state=State.AWAITING_APPROVAL).update(
                state=State.EXPIRED, finished_at=now,
                error={"code": "expired", "detail": "Nobody approved this command in time."},
            ):
                count += 1
                _audit(command, actor=command.owner, action="probe.command.expired")
    lost = {"code": "lost", "detail": "No answer from the probe was recorded."}
    lost_before = now - timedelta(seconds=MAX_CALL_TIMEOUT_SEC + 60)
    count += ProbeCommand.objects.filter(state=State.SENT, sent_at__lt=lost_before).update(
        state=State.FAILED, finished_at=now, error=lost
    )
    # Never sent late: an approval is for now, not for whenever a crashed process comes back.
    count += ProbeCommand.objects.filter(state=State.APPROVED, approved_at__lt=now - LOST_AFTER_APPROVAL).update(
        state=State.FAILED, finished_at=now, error={"code": "lost", "detail": "The platform did not send it in time."}
    )
    if count:
        selectors.outcomes.publish()
    return count


def commands_fail_in_flight(*, device: Device) -> int:
    """The probe went away: whatever was sent and not answered fails; nothing is re-sent later."""
    count = ProbeCommand.objects.filter(device=device, state=State.SENT).update(
        state=State.FAILED, finished_at=timezone.now(),
        error={"code": "device_offline", "detail": "The probe disconnected before answering."},
    )
    if count:
        selectors.outcomes.publish()
    return count


# --- helpers ------------------------------------------------------------------------------------

def _finish(command: ProbeCommand, *, state: str, result: Any = None, error: dict | None = None) -> None:
    """Store the outcome of a sent command, unless one is already stored. ``command`` is left as its row then
    is (without reading it back: the UPDATE wrote what is set here) and handed to this process's waiters."""
    def in_flight_update(values: dict[str, Any]) -> int:  # written once (ai1net.sql): every command ends here
        return sql.update_by(ProbeCommand, values, id=command.pk, state=State.SENT)

    try:
        limits.check("probe.result", result, "result")
    except limits.LimitExceeded as exc:  # declared in clients.limits: store the refusal, not the result
        state, result, error = State.FAILED, None, {"code": "too_large", "detail": str(exc)}
    outcome = {"state": state, "result": _without_nul(result), "error": _without_nul(error),
               "finished_at": timezone.now()}
    try:
        # The outcome and its post in the Studio room commit together: whoever sees one sees both.
        with transaction.atomic():
            finished = in_flight_update(outcome)
            if finished:
                _set(command, outcome)
                room_post(command=command, text=_summary(command))
    except DatabaseError:  # never leave it `sent`: the caller would wait for nothing
        logger.exception("could not store the outcome of probe command %s", command.pk)
        outcome = {"state": State.FAILED, "result": None, "finished_at": timezone.now(), "error": {
            "code": "internal_error", "detail": "The probe answered, but the answer could not be stored."}}
        finished = in_flight_update(outcome)
        if finished:
            _set(command, outcome)
            room_post(command=command, text=_summary(command))
    if not finished:  # already failed (disconnect) or swept: the first outcome stands
        return
    selectors.outcomes.publish(command)


def _set(command: ProbeCommand, fields: dict[str, Any]) -> None:
    for name, value in fields.items():
        setattr(command, name, value)


def _audit(command: ProbeCommand, *, actor: Any, action: str, ip: str | None = None, **extra: Any) -> None:
    audit_record(actor=actor, action=action, ip=ip, data={
        "command": str(command.pk), "device": str(command.device_id), "op": command.op,
        "args_hash": command.args_hash, **extra,
    })


def _without_nul(value: Any) -> Any:
    """PostgreSQL's JSON cannot hold U+0000 (a command's output may): store U+FFFD in its place."""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if isinstance(value, list):
        return [_without_nul(item) for item in value]
    if isinstance(value, dict):
        return {_without_nul(key): _without_nul(item) for key, item in value.items()}
    return value


_EXECUTOR = ThreadPoolExecutor(max_workers=32, thread_name_prefix="probes")
_inflight = 0
_inflight_changed = threading.Condition()


def _main_event_loop() -> asyncio.AbstractEventLoop | None:
    """daphne's event loop when called from a request (or on_commit) thread, else None."""
    if getattr(SyncToAsync.threadlocal, "main_event_loop_pid", None) != os.getpid():
        return None
    loop = getattr(SyncToAsync.threadlocal, "main_event_loop", None)
    return loop if loop is not None and loop.is_running() else None


def _in_background(function: Any, **kwargs: Any) -> None:
    """Run `function(**kwargs)` after the caller returns. Under daphne it runs in a worker thread
    attached to daphne's event loop, so device_call reaches the channel layer that lives there (the
    in-memory layer only works on its own loop); elsewhere (tests, management commands) in a thread."""
    global _inflight
    loop = _main_event_loop()

    def run() -> None:
        global _inflight
        try:
            function(**kwargs)
        except Exception:
            logger.exception("background %s(%s) failed", function.__name__, kwargs)
        finally:
            # This thread's connections only. A kept executor thread keeps its connection as the request
            # threads do (SQLite: reconnecting cost each command; PostgreSQL's pool takes it back here).
            if loop is None:
                connections.close_all()
            else:
                close_old_connections()
            with _inflight_changed:
                _inflight -= 1
                _inflight_changed.notify_all()

    with _inflight_changed:
        _inflight += 1
    if loop is not None:
        asyncio.run_coroutine_threadsafe(sync_to_async(run, thread_sensitive=False, executor=_EXECUTOR)(), loop)
    else:
        threading.Thread(target=run, name=f"probes-{function.__name__}", daemon=True).start()


def background_join(timeout: float = 10.0) -> bool:
    """Wait for this process's in-flight device calls (tests, graceful shutdown). True when none is left."""
    with _inflight_changed:
        return _inflight_changed.wait_for(lambda: _inflight == 0, timeout)


def _call_timeout(command: ProbeCommand) -> float:
    if command.op == "run":  # the probe's own timeout ends the process; leave room for its answer
        timeout = command.args.get("timeout", RUN_DEFAULT_TIMEOUT_SEC)
        return min(MAX_CALL_TIMEOUT_SEC, float(timeout) + 15)
    return CALL_TIMEOUT_SEC


def _read_whole(device: Device, path: str, max_pages: int = 20) -> str | None:
    """The current text of a file through the probe's paged `read` (None if binary or too long)."""
    parts: list[str] = []
    params: dict[str, Any] = {"path": path}
    for _ in range(max_pages):
        result = device_call(device=device, method="probe.read", params=params, timeout=CALL_TIMEOUT_SEC)
        text = _text_of(result)
        if text is None:
            return None
        parts.append(text)
        next_offset = result.get("next_offset") if isinstance(result, dict) else None
        if not next_offset:
            return "".join(parts)
        params = {"path": path, "offset": next_offset}
    return None


def _text_of(result: Any) -> str | None:
    """The file text from a probe `read` result, whichever of the usual shapes it has."""
    if not isinstance(result, dict) or result.get("binary") or result.get("encoding") == "base64":
        return None
    for key in ("content", "text"):
        if isinstance(result.get(key), str):
            return result[key]
    lines = result.get("lines")
    if isinstance(lines, list):
        # The probe sends [[number, text], ...] with line ends stripped.
        texts = [line[-1] if isinstance(line, list) and line else
                 line.get("text", "") if isinstance(line, dict) else str(line) for line in lines]
        return "".join(text if text.endswith("\n") else text + "\n" for text in texts)
    return None


def _request_line(command: ProbeCommand) -> str:
    args = command.args
    target = args.get("path") or args.get("pattern") or " ".join(args.get("argv") or []) or args.get("handle") or ""
    return f"{command.op} {target}".strip()


def _summary(command: ProbeCommand) -> str:
    line = _request_line(command)
    if command.state == State.AWAITING_APPROVAL:
        return f"… {line}: waiting for your approval"
    if command.state == State.DONE:
        body = json.dumps(command.result, ensure_ascii=False, indent=1)
        if len(body) > ROOM_RESULT_CHARS:
            body = body[:ROOM_RESULT_CHARS] + "\n… (truncated; the full result is on the command)"
        return f"✔ {line}\n{body}"
    error = command.error or {}
    return f"✘ {line}: {command.state} ({error.get('code', '')}: {error.get('detail', '')})"
