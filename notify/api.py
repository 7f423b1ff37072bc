"""The notification API for the person on the phone page: subscriptions, the ntfy topic, the VAPID key.

Browser session only (CSRF-checked), like the phone's own API: an agent's token may not redirect a
user's notices. Users with two-factor must have verified this sign-in.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from ai1net.accounts.authentication import SessionAuthentication
from ai1net.exceptions import Forbidden
from ai1net.schema import errors
from im.access import http_otp_satisfied
from notify import selectors, services, vapid


def client_ip(request: Request) -> str | None:
    return request.META.get("REMOTE_ADDR")


class NotifyView(APIView):
    authentication_classes = [SessionAuthentication]

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)
        if not http_otp_satisfied(request):
            raise Forbidden("Verify your sign-in with your one-time code first.", code="otp_required")


class SubscriptionOutSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    endpoint = serializers.CharField()
    service = serializers.CharField(help_text="the push service's host")
    created = serializers.DateTimeField()
    last_ok = serializers.DateTimeField(allow_null=True)
    failures = serializers.IntegerField(help_text="failed pushes since the last success")


class SubscriptionKeysSerializer(serializers.Serializer):
    p256dh = serializers.CharField(max_length=256)
    auth = serializers.CharField(max_length=256)


class SubscriptionInSerializer(serializers.Serializer):
    """``PushSubscription.toJSON()`` as the browser gives it."""

    endpoint = serializers.CharField(max_length=1024)
    keys = SubscriptionKeysSerializer()
    expirationTime = serializers.IntegerField(required=False, allow_null=True)  # noqa: N815 - the browser's name


class EndpointSerializer(serializers.Serializer):
    endpoint = serializers.CharField(max_length=1024)


class SubscriptionsView(NotifyView):
    @extend_schema(operation_id="notify_subscriptions_list", tags=["notify"],
                   responses={200: SubscriptionOutSerializer(many=True), **errors(403)})
    def get(self, request: Request) -> Response:
        return Response(selectors.subscriptions(user=request.user))

    @extend_schema(operation_id="notify_subscriptions_create", tags=["notify"], request=SubscriptionInSerializer,
                   responses={200: SubscriptionOutSerializer, 201: SubscriptionOutSerializer,
                              **errors(400, 403, 409)},
                   description="201 when this browser is new to the user, 200 when it was already subscribed. "
                               "The endpoint must be https on a public address (`bad_target`, `private_target`); "
                               "409 `too_many_subscriptions`.")
    def post(self, request: Request) -> Response:
        serializer = SubscriptionInSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        subscription, new = services.subscription_create(
            user=request.user, endpoint=data["endpoint"], p256dh=data["keys"]["p256dh"], auth=data["keys"]["auth"],
            ip=client_ip(request))
        return Response(selectors.subscription_data(subscription), status=201 if new else 200)

    @extend_schema(operation_id="notify_subscriptions_destroy", tags=["notify"], request=EndpointSerializer,
                   responses={204: None, **errors(400, 403, 404)},
                   description="Unsubscribe this browser: its endpoint in the body.")
    def delete(self, request: Request) -> Response:
        serializer = EndpointSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        services.subscription_delete(user=request.user, endpoint=serializer.validated_data["endpoint"],
                                     ip=client_ip(request))
        return Response(status=204)


class SubscriptionDetailView(NotifyView):
    @extend_schema(operation_id="notify_subscriptions_item_destroy", tags=["notify"],
                   responses={204: None, **errors(403, 404)})
    def delete(self, request: Request, subscription_id: int) -> Response:
        services.subscription_delete(user=request.user, subscription_id=subscription_id, ip=client_ip(request))
        return Response(status=204)


class NtfyOutSerializer(serializers.Serializer):
    url = serializers.CharField(allow_null=True, help_text="the topic URL, or null when none is set")
    click_url = serializers.CharField(allow_null=True, help_text="what tapping the notice opens (/m/)")
    last_ok = serializers.DateTimeField(allow_null=True)
    failures = serializers.IntegerField()


class NtfyInSerializer(serializers.Serializer):
    url = serializers.CharField(max_length=1024, help_text="https://ntfy.example/<topic>")


class NtfyView(NotifyView):
    @extend_schema(operation_id="notify_ntfy_retrieve", tags=["notify"],
                   responses={200: NtfyOutSerializer, **errors(403)})
    def get(self, request: Request) -> Response:
        return Response(selectors.ntfy_target(user=request.user))

    @extend_schema(operation_id="notify_ntfy_update", tags=["notify"], request=NtfyInSerializer,
                   responses={200: NtfyOutSerializer, **errors(400, 403)},
                   description="https only, no user name or password, not a private or local address "
                               "(`bad_target`, `private_target`).")
    def put(self, request: Request) -> Response:
        serializer = NtfyInSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        target = services.ntfy_target_set(user=request.user, url=serializer.validated_data["url"],
                                          click_url=phone_url(request), ip=client_ip(request))
        return Response(selectors.ntfy_data(target))

    @extend_schema(operation_id="notify_ntfy_destroy", tags=["notify"], responses={204: None, **errors(403)})
    def delete(self, request: Request) -> Response:
        services.ntfy_target_clear(user=request.user, ip=client_ip(request))
        return Response(status=204)


class VapidKeyView(NotifyView):
    @extend_schema(operation_id="notify_vapid_public_key_retrieve", tags=["notify"],
                   responses={200: inline_serializer("NotifyVapidKey", {
                       "enabled": serializers.BooleanField(help_text="false: Web Push is off on this platform"),
                       "public_key": serializers.CharField(help_text="applicationServerKey, base64url"),
                   }), **errors(403)})
    def get(self, request: Request) -> Response:
        keys = vapid.keys()
        return Response({"enabled": keys is not None, "public_key": keys.public_key if keys else ""})


def phone_url(request: Request) -> str:
    from django.conf import settings

    if settings.PUBLIC_URL:
        return f"{settings.PUBLIC_URL}{services.PHONE_PATH}"
    return request.build_absolute_uri(services.PHONE_PATH)
