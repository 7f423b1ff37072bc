"""REST for room members (others get 404). Thin: parse, call a selector or service, render."""

from __future__ import annotations

from rest_framework import serializers
from rest_framework.authentication import SessionAuthentication
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from ai1net.exceptions import Forbidden, ValidationFailed
from im import selectors, services
from im.access import http_otp_satisfied
from im.events import message_data, panel_data
from im.models import Room


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


class ImView(APIView):
    # People, not agent tokens, read and act in rooms; two-factor users with a verified session.
    authentication_classes = [SessionAuthentication]

    def initial(self, request: Request, *args, **kwargs) -> None:
        super().initial(request, *args, **kwargs)
        if not http_otp_satisfied(request):
            raise Forbidden("Verify your sign-in with your one-time code first.", code="otp_required")


class RoomListView(ImView):
    def get(self, request: Request) -> Response:
        rooms = selectors.rooms_for_user(user=request.user)
        return Response({"rooms": [room_data(room) for room in rooms[:200]]})


class RoomDetailView(ImView):
    def get(self, request: Request, room_id: str) -> Response:
        return Response(room_data(selectors.access_room(user=request.user, room_id=room_id)))


class MessagePostSerializer(serializers.Serializer):
    text = serializers.CharField(max_length=services.MAX_TEXT_CHARS, allow_blank=False, trim_whitespace=True)


class MessagesView(ImView):
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

    def post(self, request: Request, room_id: str) -> Response:
        serializer = MessagePostSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        message = services.text_post(actor=request.user, room_id=room_id, text=serializer.validated_data["text"])
        return Response(message_data(message), status=201)


class PanelsView(ImView):
    def get(self, request: Request, room_id: str) -> Response:
        room = selectors.access_room(user=request.user, room_id=room_id)
        return Response({"panels": [panel_data(p) for p in selectors.panels_for_room(room=room)]})


class PanelActionSerializer(serializers.Serializer):
    action = serializers.CharField(max_length=32)
    data = serializers.DictField(required=False, default=dict)


class PanelActionView(ImView):
    def post(self, request: Request, room_id: str, panel_id: str) -> Response:
        serializer = PanelActionSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        result = services.panel_act(actor=request.user, room_id=room_id, panel_id=panel_id,
                                    action=serializer.validated_data["action"],
                                    data=serializer.validated_data["data"])
        return Response(result)
