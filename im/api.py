"""REST for room members (others get 404). Thin: parse, call a selector or service, render."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from ai1net.accounts.authentication import SessionAuthentication
from ai1net.exceptions import Forbidden, ValidationFailed
from ai1net.schema import errors
from ai1net.serializers import FlatSerializer
from im import selectors, services
from im.access import http_otp_satisfied
from im.events import message_data, panel_data
from im.models import Message, Room


def room_data(room: Room) -> dict:
    return {
        "id": str(room.pk),
        "kind": room.kind,
        "title": room.title,
        "state": room.state,
        "device_id": str(room.device_id) if room.device_id else None,
        "agent_session_id": room.agent_session_id,
        "created_at": room.created_at.isoformat(),
        "last_seq": room.next_seq - 1,
    }


# --- schema only (room_data, im.events.message_data and panel_data render by hand) --------------

class RoomOutSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    kind = serializers.ChoiceField(choices=Room.Kind.choices)
    title = serializers.CharField()
    state = serializers.ChoiceField(choices=Room.State.choices)
    device_id = serializers.UUIDField(allow_null=True)
    agent_session_id = serializers.CharField()
    created_at = serializers.DateTimeField()
    last_seq = serializers.IntegerField(help_text="seq of the newest message (0: none yet)")

    class Meta:
        ref_name = "Room"


class MessageOutSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    room_id = serializers.UUIDField()
    seq = serializers.IntegerField()
    kind = serializers.ChoiceField(choices=Message.Kind.choices)
    author_user = serializers.IntegerField(allow_null=True)
    author_device = serializers.UUIDField(allow_null=True)
    body = serializers.JSONField(help_text="by kind: text {text}, question, answer {question_id, via, answers, other}, "
                                           "event")
    created_at = serializers.DateTimeField()

    class Meta:
        ref_name = "RoomMessage"


class PanelOutSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    room_id = serializers.UUIDField()
    message_id = serializers.IntegerField(allow_null=True)
    kind = serializers.CharField(help_text="e.g. `mobile.question`")
    spec = serializers.JSONField()
    state = serializers.CharField()
    ref_id = serializers.CharField()
    updated_at = serializers.DateTimeField(allow_null=True)

    class Meta:
        ref_name = "Panel"


ROOM_ERRORS = errors(403, 404)


class ImView(APIView):
    # People, not agent tokens, read and act in rooms; two-factor users with a verified session.
    authentication_classes = [SessionAuthentication]

    def initial(self, request: Request, *args, **kwargs) -> None:
        super().initial(request, *args, **kwargs)
        if not http_otp_satisfied(request):
            raise Forbidden("Verify your sign-in with your one-time code first.", code="otp_required")


class RoomListView(ImView):
    @extend_schema(operation_id="im_rooms_list", tags=["im"],
                   responses={200: inline_serializer("RoomList", {"rooms": RoomOutSerializer(many=True)}),
                              **errors(403)})
    def get(self, request: Request) -> Response:
        rooms = selectors.rooms_for_user(user=request.user)
        return Response({"rooms": [room_data(room) for room in rooms[:200]]})


class RoomDetailView(ImView):
    @extend_schema(operation_id="im_rooms_retrieve", tags=["im"], responses={200: RoomOutSerializer, **ROOM_ERRORS})
    def get(self, request: Request, room_id: str) -> Response:
        return Response(room_data(selectors.access_room(user=request.user, room_id=room_id)))


class MessagePostSerializer(FlatSerializer):
    text = serializers.CharField(max_length=services.MAX_TEXT_CHARS, allow_blank=False, trim_whitespace=True)


class MessagesView(ImView):
    @extend_schema(operation_id="im_rooms_messages_list", tags=["im"],
                   parameters=[OpenApiParameter("after", int, description="messages after this seq (default 0)"),
                               OpenApiParameter("limit", int, description="at most this many (default 50)")],
                   responses={200: inline_serializer("RoomMessagePage", {
                       "messages": MessageOutSerializer(many=True),
                       "next_after": serializers.IntegerField(help_text="pass as `after` for the next page"),
                   }), **errors(400), **ROOM_ERRORS})
    def get(self, request: Request, room_id: str) -> Response:
        room = selectors.access_room(user=request.user, room_id=room_id)
        try:
            after = int(request.query_params.get("after", 0))
            limit = int(request.query_params.get("limit", 50))
        except ValueError:
            raise ValidationFailed("after and limit must be integers.") from None
        messages = selectors.messages_after(room=room, after=after, limit=limit)
        next_after = messages[-1].seq if messages else after
        return Response({"messages": [message_data(m) for m in messages], "next_after": next_after})

    @extend_schema(operation_id="im_rooms_messages_create", tags=["im"], request=MessagePostSerializer,
                   responses={201: MessageOutSerializer, **errors(400), **ROOM_ERRORS, **errors(409)})
    def post(self, request: Request, room_id: str) -> Response:
        serializer = MessagePostSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        message = services.text_post(actor=request.user, room_id=room_id, text=serializer.validated_data["text"])
        return Response(message_data(message), status=201)


class PanelsView(ImView):
    @extend_schema(operation_id="im_rooms_panels_list", tags=["im"],
                   responses={200: inline_serializer("PanelList", {"panels": PanelOutSerializer(many=True)}),
                              **ROOM_ERRORS})
    def get(self, request: Request, room_id: str) -> Response:
        room = selectors.access_room(user=request.user, room_id=room_id)
        return Response({"panels": [panel_data(p) for p in selectors.panels_for_room(room=room)]})


class PanelActionSerializer(FlatSerializer):
    action = serializers.CharField(max_length=32)
    data = serializers.DictField(required=False, default=dict)


class PanelActionView(ImView):
    @extend_schema(operation_id="im_rooms_panels_actions_create", tags=["im"], request=PanelActionSerializer,
                   responses={200: OpenApiTypes.OBJECT, **errors(400), **ROOM_ERRORS, **errors(409, 410, 413)},
                   description="Runs the action through the panel kind's handler and returns what it returns; "
                               "`mobile.question` takes `answer` with data {nonce, answers, other} and returns "
                               "{state} like POST /api/mobile/answer.")
    def post(self, request: Request, room_id: str, panel_id: str) -> Response:
        serializer = PanelActionSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        result = services.panel_act(actor=request.user, room_id=room_id, panel_id=panel_id,
                                    action=serializer.validated_data["action"],
                                    data=serializer.validated_data["data"])
        return Response(result)
