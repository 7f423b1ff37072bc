"""The phone's API. With mobile reply off (the user's switch or the operators' stop) it does not exist: 404."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers
from rest_framework.authentication import SessionAuthentication
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from ai1net.accounts.selectors import mobile_reply_active
from ai1net.exceptions import Forbidden, NotFound
from im.access import http_otp_satisfied
from mobile import pacing, selectors, services


def client_ip(request: Request) -> str | None:
    return request.META.get("REMOTE_ADDR")


class MobileView(APIView):
    # The person answers, with their browser session (CSRF-checked); agent tokens may not.
    authentication_classes = [SessionAuthentication]

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)
        if not mobile_reply_active(request.user):
            raise NotFound()
        if not http_otp_satisfied(request):
            raise Forbidden("Verify your sign-in with your one-time code first.", code="otp_required")


class PendingView(MobileView):
    def get(self, request: Request) -> Response:
        services.questions_expire_due(user=request.user)
        services.messages_release_due(user=request.user)
        body = {"questions": selectors.pending_questions(user=request.user)}
        if request.query_params.get("recent"):
            body["recent"] = selectors.recent_questions(user=request.user)
        return Response(body)


class AnswerSerializer(serializers.Serializer):
    question_id = serializers.CharField(max_length=64)
    nonce = serializers.CharField(max_length=128)
    answers = serializers.DictField()
    other = serializers.DictField(required=False, default=dict)


class AnswerView(MobileView):
    def post(self, request: Request) -> Response:
        serializer = AnswerSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        return Response(services.answer_submit(actor=request.user, question_id=data["question_id"],
                                               nonce=data["nonce"], answers=data["answers"], other=data["other"],
                                               ip=client_ip(request)))


class StateView(MobileView):
    def get(self, request: Request) -> Response:
        services.messages_release_due(user=request.user)
        return Response(selectors.mobile_state(user=request.user))


class MessageSerializer(serializers.Serializer):
    text = serializers.CharField()  # its limit (clients.limits) is enforced by the service: 413 naming it


class SessionMessageView(MobileView):
    def post(self, request: Request, session_id: str) -> Response:
        serializer = MessageSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        message = services.phone_message_send(actor=request.user, session_id=session_id,
                                              text=serializer.validated_data["text"], ip=client_ip(request))
        return Response({"message_id": str(message.pk), "state": message.state,
                         **pacing.waiting_info(message=message)}, status=201)


class KeepGoingSerializer(serializers.Serializer):
    enabled = serializers.BooleanField()


class KeepGoingView(MobileView):
    def post(self, request: Request, session_id: str) -> Response:
        serializer = KeepGoingSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        session = services.keep_going_set(actor=request.user, session_id=session_id,
                                          enabled=serializer.validated_data["enabled"], ip=client_ip(request))
        return Response({"session_id": session.session_id, "keep_going": session.keep_going})
