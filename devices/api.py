"""Pairing (RFC 8628) and device ledger API. Thin: parse, call one service or selector, render."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.urls import reverse
from rest_framework import serializers, status
from rest_framework.permissions import AllowAny, IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from devices import selectors, services
from devices.access import OtpSatisfied
from devices.models import Device, PairingRequest


def client_ip(request: Any) -> str | None:
    return request.META.get("REMOTE_ADDR") or None


def public_base(request: Any) -> str:
    return settings.PUBLIC_URL or request.build_absolute_uri("/").rstrip("/")


class PairingCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100)
    kind = serializers.ChoiceField(choices=Device.Kind.choices)
    hostname = serializers.CharField(max_length=255, required=False, allow_blank=True, default="")
    os = serializers.CharField(max_length=100, required=False, allow_blank=True, default="")
    version = serializers.CharField(max_length=50, required=False, allow_blank=True, default="")
    ephemeral = serializers.BooleanField(required=False, default=False)


class PairingTokenSerializer(serializers.Serializer):
    device_code = serializers.CharField(max_length=200)


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
    name = serializers.CharField(max_length=100)


class PairingCreateView(APIView):
    """Device side, no login: start a pairing (rate-limited per address)."""

    authentication_classes: list = []
    permission_classes = [AllowAny]

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

    def post(self, request: Request) -> Response:
        data = PairingTokenSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        device, token = services.pairing_claim(device_code=data.validated_data["device_code"])
        return Response({"device_id": str(device.pk), "device_token": token}, headers={"Cache-Control": "no-store"})


class PairingCodeView(APIView):
    """User side: open a code (binds it to me, `scanned`)."""

    permission_classes = [IsAuthenticated, OtpSatisfied]

    def get(self, request: Request, user_code: str) -> Response:
        pairing = services.pairing_scan(user=request.user, user_code=user_code, ip=client_ip(request))
        return Response(PairingSerializer(pairing, context={"user_code": _shown(user_code)}).data)


class PairingApproveView(APIView):
    permission_classes = [IsAuthenticated, OtpSatisfied]

    def post(self, request: Request, user_code: str) -> Response:
        pairing = services.pairing_approve(user=request.user, user_code=user_code, ip=client_ip(request))
        return Response(PairingSerializer(pairing, context={"user_code": _shown(user_code)}).data)


class PairingDenyView(APIView):
    permission_classes = [IsAuthenticated, OtpSatisfied]

    def post(self, request: Request, user_code: str) -> Response:
        pairing = services.pairing_deny(user=request.user, user_code=user_code, ip=client_ip(request))
        return Response(PairingSerializer(pairing, context={"user_code": _shown(user_code)}).data)


class DeviceListView(APIView):
    permission_classes = [IsAuthenticated, OtpSatisfied]

    def get(self, request: Request) -> Response:
        devices = selectors.devices_for_user(user=request.user, kind=request.query_params.get("kind") or None)
        return Response(DeviceSerializer(devices, many=True).data)


class DeviceDetailView(APIView):
    permission_classes = [IsAuthenticated, OtpSatisfied]

    def get(self, request: Request, device_id: str) -> Response:
        return Response(DeviceSerializer(selectors.access_device(user=request.user, device_id=device_id)).data)

    def patch(self, request: Request, device_id: str) -> Response:
        device = selectors.access_device(user=request.user, device_id=device_id)
        data = DeviceRenameSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        services.device_rename(device=device, name=data.validated_data["name"])
        return Response(DeviceSerializer(device).data)


class DeviceRevokeView(APIView):
    permission_classes = [IsAuthenticated, OtpSatisfied]

    def post(self, request: Request, device_id: str) -> Response:
        device = selectors.access_device(user=request.user, device_id=device_id)
        services.device_revoke(device=device, actor=request.user, ip=client_ip(request))
        device.refresh_from_db()
        return Response(DeviceSerializer(device).data)


def _shown(user_code: str) -> str:
    code = services.normalize_user_code(user_code)
    return services.format_user_code(code) if code else ""
