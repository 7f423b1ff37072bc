"""The phone's API. With mobile reply off (the user's switch or the operators' stop) it does not exist: 404."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from ai1net.accounts.authentication import SessionAuthentication
from ai1net.accounts.selectors import mobile_reply_active
from ai1net.exceptions import Forbidden, NotFound
from ai1net.schema import errors
from ai1net.serializers import FlatSerializer
from im.access import http_otp_satisfied
from mobile import pacing, selectors, services
from mobile.models import AgentSession, PhoneMessage, Question


def client_ip(request: Request) -> str | None:
    return request.META.get("REMOTE_ADDR")


# --- schema only (mobile.events and mobile.selectors render by hand) ----------------------------

class QuestionOutSerializer(serializers.Serializer):
    question_id = serializers.UUIDField()
    session_id = serializers.CharField()
    room_id = serializers.UUIDField()
    device_id = serializers.UUIDField()
    panel_id = serializers.IntegerField(allow_null=True)
    questions = serializers.JSONField(help_text="AskUserQuestion's questions: [{question, header, options, "
                                                "multiSelect}]")
    state = serializers.ChoiceField(choices=Question.State.choices)
    created_at = serializers.DateTimeField()
    expires_at = serializers.DateTimeField()
    nonce = serializers.CharField(required=False, help_text="pending questions only: present it with the answer")
    kind = serializers.CharField(required=False, help_text="`permission` for a tool-permission request")
    tool_name = serializers.CharField(required=False)
    input_hash = serializers.CharField(required=False, help_text="permission: present it with the decision")
    rendering = serializers.JSONField(required=False, help_text="permission: {kind: command|diff|input, text, "
                                                                "truncated}, plain text")

    class Meta:
        ref_name = "PhoneQuestion"


class WaitingMessageSerializer(serializers.Serializer):
    message_id = serializers.UUIDField()
    text = serializers.CharField()
    position = serializers.IntegerField()


class SessionOutSerializer(serializers.Serializer):
    session_id = serializers.CharField()
    device_id = serializers.UUIDField()
    room_id = serializers.UUIDField()
    title = serializers.CharField()
    cwd = serializers.CharField()
    host = serializers.CharField()
    keep_going = serializers.BooleanField()
    state = serializers.ChoiceField(choices=AgentSession.State.choices)
    created_at = serializers.DateTimeField()
    waiting_messages = WaitingMessageSerializer(many=True, help_text="phone messages held by the pacer, in order")

    class Meta:
        ref_name = "PhoneSession"


class BridgeStateSerializer(serializers.Serializer):
    device_id = serializers.UUIDField()
    name = serializers.CharField()
    online = serializers.BooleanField()
    last_seen_at = serializers.DateTimeField(allow_null=True)


class TodaySerializer(serializers.Serializer):
    asked = serializers.IntegerField()
    answered_on_phone = serializers.IntegerField()
    answered_on_desktop = serializers.IntegerField()
    moved_to_desktop = serializers.IntegerField()
    expired = serializers.IntegerField()


class StateOutSerializer(serializers.Serializer):
    mobile_reply = serializers.BooleanField()
    global_stop = serializers.BooleanField(help_text="the operators turned mobile reply off for everyone")
    bridges = BridgeStateSerializer(many=True)
    queue_depth = serializers.IntegerField()
    sessions = SessionOutSerializer(many=True)
    today = TodaySerializer(help_text="since local midnight")

    class Meta:
        ref_name = "PhoneState"


# 404: mobile reply is off (the user's switch or the operators' stop); 403: not logged in or not verified.
MOBILE_ERRORS = errors(403, 404)


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
    @extend_schema(operation_id="mobile_pending_retrieve", tags=["mobile"],
                   parameters=[OpenApiParameter("recent", str, description="any value: add `recent`, the questions "
                                                                           "settled in the last 30 minutes")],
                   responses={200: inline_serializer("PhonePending", {
                       "questions": QuestionOutSerializer(many=True),
                       "recent": QuestionOutSerializer(many=True, required=False),
                   }), **MOBILE_ERRORS})
    def get(self, request: Request) -> Response:
        services.questions_expire_due(user=request.user)
        services.messages_release_due(user=request.user)
        body = {"questions": selectors.pending_questions(user=request.user)}
        if request.query_params.get("recent"):
            body["recent"] = selectors.recent_questions(user=request.user)
        return Response(body)


class AnswerSerializer(FlatSerializer):
    question_id = serializers.CharField(max_length=64)
    nonce = serializers.CharField(max_length=128)
    answers = serializers.DictField()
    other = serializers.DictField(required=False, default=dict)
    input_hash = serializers.CharField(max_length=64, required=False, default="", allow_blank=True,
                                       help_text="permission requests: the input_hash shown with it")

    class Meta:
        ref_name = "PhoneAnswer"


class AnswerView(MobileView):
    @extend_schema(operation_id="mobile_answer_create", tags=["mobile"], request=AnswerSerializer,
                   responses={200: inline_serializer("PhoneAnswered", {
                       "state": serializers.ChoiceField(choices=[Question.State.ANSWERED.value]),
                   }), **errors(400), **MOBILE_ERRORS, **errors(409, 410, 413)},
                   description="The nonce is burned once: 403 `bad_nonce`; 409 `already_answered`, "
                               "`answered_on_desktop`, `moved_to_desktop`, `input_mismatch` (a permission request's "
                               "decision for another tool input); 410 `expired`, `session_ended`.")
    def post(self, request: Request) -> Response:
        serializer = AnswerSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        return Response(services.answer_submit(actor=request.user, question_id=data["question_id"],
                                               nonce=data["nonce"], answers=data["answers"], other=data["other"],
                                               ip=client_ip(request), input_hash=data["input_hash"]))


class StateView(MobileView):
    @extend_schema(operation_id="mobile_state_retrieve", tags=["mobile"],
                   responses={200: StateOutSerializer, **MOBILE_ERRORS})
    def get(self, request: Request) -> Response:
        services.messages_release_due(user=request.user)
        return Response(selectors.mobile_state(user=request.user))


class MessageSerializer(FlatSerializer):
    text = serializers.CharField()  # its limit (clients.limits) is enforced by the service: 413 naming it

    class Meta:
        ref_name = "PhoneMessage"


class SessionMessageView(MobileView):
    @extend_schema(operation_id="mobile_sessions_messages_create", tags=["mobile"], request=MessageSerializer,
                   responses={201: inline_serializer("PhoneMessageSent", {
                       "message_id": serializers.UUIDField(),
                       "state": serializers.ChoiceField(choices=PhoneMessage.State.choices),
                       "position": serializers.IntegerField(required=False, help_text="while waiting: place in line"),
                       "release_at": serializers.DateTimeField(required=False, help_text="while waiting: when the "
                                                                                         "first in line goes"),
                   }), **errors(400), **MOBILE_ERRORS, **errors(410, 413, 429)},
                   description="400 `agent_echo`; 410 `session_ended`; 429 when the session's daily budget or "
                               "waiting line is full.")
    def post(self, request: Request, session_id: str) -> Response:
        serializer = MessageSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        message = services.phone_message_send(actor=request.user, session_id=session_id,
                                              text=serializer.validated_data["text"], ip=client_ip(request))
        return Response({"message_id": str(message.pk), "state": message.state,
                         **pacing.waiting_info(message=message)}, status=201)


class KeepGoingSerializer(FlatSerializer):
    enabled = serializers.BooleanField()

    class Meta:
        ref_name = "PhoneKeepGoing"


class KeepGoingView(MobileView):
    @extend_schema(operation_id="mobile_sessions_keep_going_create", tags=["mobile"], request=KeepGoingSerializer,
                   responses={200: inline_serializer("PhoneKeepGoingSet", {
                       "session_id": serializers.CharField(),
                       "keep_going": serializers.BooleanField(),
                   }), **errors(400), **MOBILE_ERRORS, **errors(410)})
    def post(self, request: Request, session_id: str) -> Response:
        serializer = KeepGoingSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        session = services.keep_going_set(actor=request.user, session_id=session_id,
                                          enabled=serializer.validated_data["enabled"], ip=client_ip(request))
        return Response({"session_id": session.session_id, "keep_going": session.keep_going})
