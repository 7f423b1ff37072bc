"""The agents' API (per-user API token or the session with CSRF). Thin: parse, call, render."""

from __future__ import annotations

import logging
import uuid
from typing import Any

from django.conf import settings
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from ai1net.accounts.models import ApiToken
from ai1net.exceptions import Forbidden, ValidationFailed
from ai1net.schema import errors
from im.access import http_otp_satisfied
from probes import selectors, services
from probes.models import ALL_OPS, ProbeCommand

logger = logging.getLogger(__name__)

MAX_WAIT_SEC = 60.0
DEFAULT_WAIT_SEC = 10.0


def _wait(value: Any, default: float) -> float:
    if value is None or value == "":
        return default
    try:
        wait = float(value)
    except (TypeError, ValueError):
        raise ValidationFailed("wait: must be a number of seconds.", code="invalid_wait") from None
    if isinstance(value, bool) or wait != wait or wait < 0:
        raise ValidationFailed("wait: must be a number of seconds.", code="invalid_wait")
    return min(wait, MAX_WAIT_SEC)


def _ip(request: Request) -> str | None:
    return request.META.get("REMOTE_ADDR") or None


def _command_response(command: ProbeCommand) -> Response:
    return Response(selectors.command_describe(command), status=200 if command.is_final else 202)


def _studio_room_id(user: Any, device: Any) -> Any:
    try:
        from im.services import room_get_or_create_studio
    except ImportError:
        return None
    try:
        return room_get_or_create_studio(user=user, device=device).pk
    except Exception:
        logger.exception("no Studio room for probe %s", device.pk)
        return None


# --- schema only (the gateway validates in probes.ops and names the field on a 400) ---------------

class ProbeOut(serializers.Serializer):
    id = serializers.UUIDField()
    name = serializers.CharField()
    online = serializers.BooleanField()
    hostname = serializers.CharField()
    os = serializers.CharField()
    version = serializers.CharField()
    roots = serializers.ListField(child=serializers.CharField())
    modes = serializers.ListField(child=serializers.ChoiceField(choices=["write", "exec"]))
    last_seen_at = serializers.DateTimeField(allow_null=True)


class ProbeDetailOut(ProbeOut):
    room_id = serializers.UUIDField(allow_null=True, help_text="the probe's Studio room")


class CommandIn(serializers.Serializer):
    op = serializers.ChoiceField(choices=sorted(ALL_OPS))
    args = serializers.DictField(help_text="path, offset/limit (read), depth (read_tree), pattern/glob (grep), "
                                           "content or diff (write), argv/cwd/timeout (run).")
    wait = serializers.FloatField(required=False, help_text=f"seconds to wait for the end (default "
                                                             f"{DEFAULT_WAIT_SEC:g}, at most {MAX_WAIT_SEC:g})")


class ErrorOut(serializers.Serializer):
    code = serializers.CharField()
    detail = serializers.CharField()

    class Meta:
        ref_name = "CommandError"


class CommandProbeOut(serializers.Serializer):
    id = serializers.UUIDField()
    name = serializers.CharField()


class CommandOut(serializers.Serializer):
    id = serializers.UUIDField()
    probe = CommandProbeOut()
    op = serializers.CharField()
    args = serializers.DictField()
    args_hash = serializers.CharField()
    state = serializers.ChoiceField(choices=ProbeCommand.State.values)
    via = serializers.ChoiceField(choices=ProbeCommand.Via.values)
    created_at = serializers.DateTimeField()
    expires_at = serializers.DateTimeField(allow_null=True)
    approved_at = serializers.DateTimeField(allow_null=True)
    sent_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)
    preview = serializers.CharField(required=False, help_text="writes: the diff shown before approval")
    result = serializers.JSONField(required=False, help_text="when done")
    error = ErrorOut(required=False, help_text="when failed, rejected or expired")


class DecisionIn(serializers.Serializer):
    args_hash = serializers.CharField(required=False, help_text="the args_hash you were shown")
    wait = serializers.FloatField(required=False)


WAIT_PARAM = OpenApiParameter("wait", float, description="long-poll up to this many seconds (at most 60)")
FINAL_OR_NOT = {200: CommandOut, 202: CommandOut}
PROBE_ERRORS = errors(403, 404)  # 403: not logged in, or two-factor not verified (`otp_required`)


def _is_agent(request: Request) -> bool:
    return isinstance(request.auth, ApiToken)


class ProbesView(APIView):
    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)
        # A session of a user with two-factor counts only once verified (as on every page).
        if not _is_agent(request) and not http_otp_satisfied(request):
            raise Forbidden("Verify your sign-in with your one-time code first.", code="otp_required")


class ProbeListApi(ProbesView):
    @extend_schema(operation_id="probes_list", tags=["probes"], responses={200: ProbeOut(many=True), **errors(403)})
    def get(self, request: Request) -> Response:
        return Response([selectors.probe_describe(d) for d in selectors.probes_for_user(user=request.user)])


class ProbeDetailApi(ProbesView):
    @extend_schema(operation_id="probes_retrieve", tags=["probes"], responses={200: ProbeDetailOut, **PROBE_ERRORS})
    def get(self, request: Request, probe: str) -> Response:
        device = selectors.probe_access(user=request.user, probe=probe)
        return Response({**selectors.probe_describe(device), "room_id": _studio_room_id(request.user, device)})


class ProbeCommandsApi(ProbesView):
    @extend_schema(operation_id="probes_commands_list", tags=["probes"],
                   responses={200: CommandOut(many=True), **PROBE_ERRORS})
    def get(self, request: Request, probe: str) -> Response:
        device = selectors.probe_access(user=request.user, probe=probe)
        commands = selectors.commands_for_probe(user=request.user, device=device)
        return Response([selectors.command_describe(c) for c in commands])

    @extend_schema(operation_id="probes_commands_create", tags=["probes"], request=CommandIn,
                   responses={**FINAL_OR_NOT, **errors(400), **PROBE_ERRORS, **errors(413, 429)})
    def post(self, request: Request, probe: str) -> Response:
        if not isinstance(request.data, dict):
            raise ValidationFailed("The body must be a JSON object with op, args and wait.")
        wait = _wait(request.data.get("wait"), DEFAULT_WAIT_SEC)
        device = selectors.probe_access(user=request.user, probe=probe)
        via = ProbeCommand.Via.API if _is_agent(request) else ProbeCommand.Via.STUDIO
        command_id = uuid.uuid4()
        with selectors.command_watched(command_id) as mark:
            command = services.command_create(
                user=request.user, device=device, op=request.data.get("op"), args=request.data.get("args"),
                via=via, ip=_ip(request), command_id=command_id,
            )
            command = selectors.command_wait(user=request.user, command_id=command_id, wait=wait, first=command,
                                             since=mark)
        return _command_response(command)


class CommandDetailApi(ProbesView):
    @extend_schema(operation_id="probes_commands_retrieve", tags=["probes"], parameters=[WAIT_PARAM],
                   responses={**FINAL_OR_NOT, **errors(400), **PROBE_ERRORS})
    def get(self, request: Request, command_id: Any) -> Response:
        # `?wait=N` long-polls, through the owner's decision too.
        wait = _wait(request.query_params.get("wait"), 0.0)
        command = selectors.command_wait(user=request.user, command_id=command_id, wait=wait, through_approval=True)
        return _command_response(command)


class CommandApproveApi(ProbesView):
    @extend_schema(operation_id="probes_commands_approve_create", tags=["probes"], request=DecisionIn,
                   responses={**FINAL_OR_NOT, **errors(400), **PROBE_ERRORS, **errors(409)},
                   description="403 `approval_needs_a_person` with an API token; 409 when the arguments differ "
                               "from args_hash or the command no longer awaits approval.")
    def post(self, request: Request, command_id: Any) -> Response:
        if _is_agent(request) and not settings.PROBES_TOKEN_APPROVALS:
            # The gateway stands between the agent and the machine: the agent cannot wave itself through.
            raise Forbidden("Approvals come from a person: approve in Studio or on the phone, not with an API token.",
                            code="approval_needs_a_person")
        data = request.data if isinstance(request.data, dict) else {}
        seen_hash = data.get("args_hash")
        if seen_hash is not None and not isinstance(seen_hash, str):
            raise ValidationFailed("args_hash: must be a string.")
        wait = _wait(data.get("wait"), 0.0)
        with selectors.command_watched(command_id) as mark:
            command = services.command_approve(user=request.user, command_id=command_id, seen_hash=seen_hash,
                                               ip=_ip(request))
            command = selectors.command_wait(user=request.user, command_id=command.pk, wait=wait, first=command,
                                             since=mark)
        return _command_response(command)


class CommandRejectApi(ProbesView):
    @extend_schema(operation_id="probes_commands_reject_create", tags=["probes"], request=None,
                   responses={200: CommandOut, **PROBE_ERRORS, **errors(409)})
    def post(self, request: Request, command_id: Any) -> Response:
        command = services.command_reject(user=request.user, command_id=command_id, ip=_ip(request))
        return _command_response(command)


class ApprovalsApi(ProbesView):
    """What waits for my decision: for Studio and the phone page."""

    @extend_schema(operation_id="probes_approvals_list", tags=["probes"],
                   responses={200: CommandOut(many=True), **errors(403)})
    def get(self, request: Request) -> Response:
        services.commands_expire()
        return Response([selectors.command_describe(c) for c in selectors.approvals_for_user(user=request.user)])
