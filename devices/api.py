"""Pairing (RFC 8628) and device ledger API. Thin: parse, call one service or selector, render."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.urls import reverse
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.parsers import JSONParser
from rest_framework.permissions import AllowAny, IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from ai1net.schema import DEVICE_TOKEN, ErrorSerializer, errors
from clients.limits import LIMITS
from devices import selectors, services
from devices.access import OtpSatisfied
from devices.models import Device, PairingRequest


def client_ip(request: Any) -> str | None:
    return request.META.get("REMOTE_ADDR") or None


def public_base(request: Any) -> str:
    return settings.PUBLIC_URL or request.build_absolute_uri("/").rstrip("/")


class PairingCreateSerializer(serializers.Serializer):
    # Sizes declared once in clients.limits (the clients check the same numbers before sending).
    name = serializers.CharField(max_length=LIMITS["device.name"].max)
    kind = serializers.ChoiceField(choices=Device.Kind.choices)
    hostname = serializers.CharField(max_length=LIMITS["device.hostname"].max, required=False, allow_blank=True,
                                     default="")
    os = serializers.CharField(max_length=LIMITS["device.os"].max, required=False, allow_blank=True, default="")
    version = serializers.CharField(max_length=LIMITS["device.version"].max, required=False, allow_blank=True,
                                    default="")
    ephemeral = serializers.BooleanField(required=False, default=False)


class PairingTokenSerializer(serializers.Serializer):
    device_code = serializers.CharField(max_length=LIMITS["pairing.device_code"].max)


class PairingSerializer(serializers.ModelSerializer):
    user_code = serializers.SerializerMethodField()

    class Meta:
        model = PairingRequest
        fields = ["name", "kind", "hostname", "os", "client_version", "ephemeral", "state", "expires_at",
                  "user_code"]

    def get_user_code(self, obj: PairingRequest) -> str:
        return self.context.get("user_code", "")


class DeviceSerializer(serializers.ModelSerializer):
    online = serializers.BooleanField(source="is_online", read_only=True)

    class Meta:
        model = Device
        fields = ["id", "name", "kind", "hostname", "os", "client_version", "status", "ephemeral", "online",
                  "last_seen_at", "connection_count", "created_at", "capabilities", "ports", "roots"]
        read_only_fields = fields


class DeviceRenameSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=LIMITS["device.name"].max)


# --- schema only (what the views render by hand) ------------------------------------------------

class PairingStartedSerializer(serializers.Serializer):
    device_code = serializers.CharField(help_text="secret: poll POST /api/devices/pairings/token with it")
    user_code = serializers.CharField(help_text="shown to the person, e.g. `BCDF-GHJK`")
    verification_uri = serializers.URLField()
    verification_uri_complete = serializers.URLField()
    expires_in = serializers.IntegerField(help_text="seconds")
    interval = serializers.IntegerField(help_text="seconds between polls")


class PairingClaimedSerializer(serializers.Serializer):
    device_id = serializers.UUIDField()
    device_token = serializers.CharField(help_text="shown once: the device's bearer token")


class OutboxItemSerializer(serializers.Serializer):
    seq = serializers.IntegerField()
    kind = serializers.CharField()
    payload = serializers.JSONField()


class BridgePullInSerializer(serializers.Serializer):
    ackedSeq = serializers.IntegerField(min_value=0, required=False, default=0,
                                        help_text="acks every item up to this seq")


class BridgePullOutSerializer(serializers.Serializer):
    deviceId = serializers.UUIDField()
    heartbeatSec = serializers.FloatField()
    holdSec = serializers.FloatField()
    items = OutboxItemSerializer(many=True, help_text="unacked items after ackedSeq (empty when the hold ran out)")


class RpcErrorSerializer(serializers.Serializer):
    code = serializers.IntegerField()
    message = serializers.CharField()
    data = serializers.JSONField(required=False)


class BridgePushInSerializer(serializers.Serializer):
    id = serializers.CharField(max_length=LIMITS["rpc.id"].max,
                               help_text="string or integer; a repeated id is answered once")
    method = serializers.CharField(max_length=LIMITS["rpc.method"].max)
    params = serializers.DictField(required=False, default=dict)


class BridgePushOutSerializer(serializers.Serializer):
    id = serializers.CharField(help_text="the request's id, as sent")
    result = serializers.JSONField(required=False)
    error = RpcErrorSerializer(required=False)


PAIRING_CODE_ERRORS = errors(403, 404, 410, 429)
DEVICE_ERRORS = errors(403, 404)


class PairingCreateView(APIView):
    """Device side, no login: start a pairing (rate-limited per address)."""

    authentication_classes: list = []
    permission_classes = [AllowAny]

    @extend_schema(operation_id="devices_pairings_create", tags=["devices"], auth=[],
                   request=PairingCreateSerializer,
                   responses={201: PairingStartedSerializer, **errors(400, 429, 503)})
    def post(self, request: Request) -> Response:
        data = PairingCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        pairing, device_code, user_code = services.pairing_create(
            name=v["name"], kind=v["kind"], hostname=v["hostname"], os_name=v["os"], version=v["version"],
            ephemeral=v["ephemeral"], ip=client_ip(request),
        )
        shown = services.format_user_code(user_code)
        verification_uri = public_base(request) + reverse("devices:pair")
        return Response(
            {
                "device_code": device_code,
                "user_code": shown,
                "verification_uri": verification_uri,
                "verification_uri_complete": public_base(request) + reverse("devices:pair-code", args=[shown]),
                "expires_in": int((pairing.expires_at - pairing.created_at).total_seconds()),
                "interval": pairing.interval,
            },
            status=status.HTTP_201_CREATED,
        )


class PairingTokenView(APIView):
    """Device side, no login: poll; 400 {"error": authorization_pending|slow_down|...} or the token once."""

    authentication_classes: list = []
    permission_classes = [AllowAny]

    @extend_schema(operation_id="devices_pairings_token_create", tags=["devices"], auth=[],
                   request=PairingTokenSerializer,
                   responses={200: PairingClaimedSerializer, **errors(400, 429)},
                   description="400 `error` (RFC 8628 3.5): authorization_pending, slow_down, access_denied, "
                               "expired_token, invalid_grant.")
    def post(self, request: Request) -> Response:
        data = PairingTokenSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        device, token = services.pairing_claim(device_code=data.validated_data["device_code"], ip=client_ip(request))
        return Response({"device_id": str(device.pk), "device_token": token}, headers={"Cache-Control": "no-store"})


class PairingCodeView(APIView):
    """User side: open a code (binds it to me, `scanned`)."""

    permission_classes = [IsAuthenticated, OtpSatisfied]

    @extend_schema(operation_id="devices_pairings_code_retrieve", tags=["devices"],
                   responses={200: PairingSerializer, **PAIRING_CODE_ERRORS})
    def get(self, request: Request, user_code: str) -> Response:
        pairing = services.pairing_scan(user=request.user, user_code=user_code, ip=client_ip(request))
        return Response(PairingSerializer(pairing, context={"user_code": _shown(user_code)}).data)


class PairingApproveView(APIView):
    permission_classes = [IsAuthenticated, OtpSatisfied]

    @extend_schema(operation_id="devices_pairings_code_approve_create", tags=["devices"], request=None,
                   responses={200: PairingSerializer, **PAIRING_CODE_ERRORS, **errors(409)})
    def post(self, request: Request, user_code: str) -> Response:
        pairing = services.pairing_approve(user=request.user, user_code=user_code, ip=client_ip(request))
        return Response(PairingSerializer(pairing, context={"user_code": _shown(user_code)}).data)


class PairingDenyView(APIView):
    permission_classes = [IsAuthenticated, OtpSatisfied]

    @extend_schema(operation_id="devices_pairings_code_deny_create", tags=["devices"], request=None,
                   responses={200: PairingSerializer, **PAIRING_CODE_ERRORS, **errors(409)})
    def post(self, request: Request, user_code: str) -> Response:
        pairing = services.pairing_deny(user=request.user, user_code=user_code, ip=client_ip(request))
        return Response(PairingSerializer(pairing, context={"user_code": _shown(user_code)}).data)


class DeviceListView(APIView):
    permission_classes = [IsAuthenticated, OtpSatisfied]

    @extend_schema(operation_id="devices_list", tags=["devices"],
                   parameters=[OpenApiParameter("kind", str, enum=Device.Kind.values, description="only this kind")],
                   responses={200: DeviceSerializer(many=True), **errors(403)})
    def get(self, request: Request) -> Response:
        devices = selectors.devices_for_user(user=request.user, kind=request.query_params.get("kind") or None)
        return Response(DeviceSerializer(devices, many=True).data)


class DeviceDetailView(APIView):
    permission_classes = [IsAuthenticated, OtpSatisfied]

    @extend_schema(operation_id="devices_retrieve", tags=["devices"],
                   responses={200: DeviceSerializer, **DEVICE_ERRORS})
    def get(self, request: Request, device_id: str) -> Response:
        return Response(DeviceSerializer(selectors.access_device(user=request.user, device_id=device_id)).data)

    @extend_schema(operation_id="devices_partial_update", tags=["devices"], request=DeviceRenameSerializer,
                   responses={200: DeviceSerializer, **errors(400), **DEVICE_ERRORS})
    def patch(self, request: Request, device_id: str) -> Response:
        device = selectors.access_device(user=request.user, device_id=device_id)
        data = DeviceRenameSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        services.device_rename(device=device, name=data.validated_data["name"])
        return Response(DeviceSerializer(device).data)


class DeviceRevokeView(APIView):
    permission_classes = [IsAuthenticated, OtpSatisfied]

    @extend_schema(operation_id="devices_revoke_create", tags=["devices"], request=None,
                   responses={200: DeviceSerializer, **DEVICE_ERRORS})
    def post(self, request: Request, device_id: str) -> Response:
        device = selectors.access_device(user=request.user, device_id=device_id)
        services.device_revoke(device=device, actor=request.user, ip=client_ip(request))
        device.refresh_from_db()
        return Response(DeviceSerializer(device).data)


class BridgePullSchema(APIView):
    """Schema only, never routed: ``POST /api/devices/bridge/pull`` is ``devices.longpoll.pull``."""

    parser_classes = [JSONParser]

    @extend_schema(operation_id="devices_bridge_pull_create", tags=["devices"], auth=[{DEVICE_TOKEN: []}],
                   request=BridgePullInSerializer,
                   responses={200: BridgePullOutSerializer, **errors(400, 401, 403, 413),
                              409: OpenApiResponse(ErrorSerializer, description="`replaced`: a newer pull took over.")},
                   summary="Long-poll the device's outbox (bridges whose WebSocket is refused)",
                   description="Acks every item up to ackedSeq, then holds up to holdSec until unacked items "
                               "exist. 401 `unauthorized`, 403 `revoked` or `bridge_only` are final.")
    def post(self, request: Request) -> Response:  # pragma: no cover
        raise NotImplementedError


class BridgePushSchema(APIView):
    """Schema only, never routed: ``POST /api/devices/bridge/push`` is ``devices.longpoll.push``."""

    parser_classes = [JSONParser]

    @extend_schema(operation_id="devices_bridge_push_create", tags=["devices"], auth=[{DEVICE_TOKEN: []}],
                   request=BridgePushInSerializer,
                   responses={200: BridgePushOutSerializer, **errors(400, 401, 403, 413)},
                   summary="A device -> platform request over HTTP (the tunnel's JSON-RPC, idempotent by id)",
                   description="Answers 200 with `result` or a JSON-RPC `error`. 401 `unauthorized`, "
                               "403 `revoked` or `bridge_only` are final.")
    def post(self, request: Request) -> Response:  # pragma: no cover
        raise NotImplementedError


def _shown(user_code: str) -> str:
    code = services.normalize_user_code(user_code)
    return services.format_user_code(code) if code else ""
