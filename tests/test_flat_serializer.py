"""ai1net.serializers.FlatSerializer: DRF's validation, with the declared fields copied a level deep."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework import serializers

from ai1net.serializers import FlatSerializer
from im.api import PanelActionSerializer
from mobile.api import AnswerSerializer

FIELDS: dict[str, Any] = {
    "question_id": lambda: serializers.CharField(max_length=8),
    "answers": lambda: serializers.DictField(),
    "other": lambda: serializers.DictField(required=False, default=dict),
    "flag": lambda: serializers.BooleanField(),
    "count": lambda: serializers.IntegerField(min_value=1, required=False),
    "tags": lambda: serializers.ListField(child=serializers.CharField(max_length=3), required=False),
}
Deep = type("Deep", (serializers.Serializer,), {name: make() for name, make in FIELDS.items()})
Flat = type("Flat", (FlatSerializer,), {name: make() for name, make in FIELDS.items()})

BODIES = [
    {"question_id": "q1", "answers": {"a": "b"}, "flag": True},
    {"question_id": "q1", "answers": {"a": "b"}, "flag": "yes", "count": "3", "tags": ["x", "yz"], "other": {"o": 1}},
    {},
    {"question_id": "far too long", "answers": [], "flag": "maybe", "count": 0, "tags": ["long one", 5]},
    {"question_id": None, "answers": None, "flag": None, "tags": "x"},
    "not an object",
]


@pytest.mark.parametrize("body", BODIES)
def test_a_flat_serializer_validates_and_refuses_as_drfs_own(body: Any) -> None:
    deep, flat = Deep(data=body), Flat(data=body)
    assert flat.is_valid() == deep.is_valid()
    assert flat.errors == deep.errors
    if not deep.errors:
        assert flat.validated_data == deep.validated_data


def test_each_instance_binds_copies_and_the_declared_fields_stay_unbound() -> None:
    first, second = Flat(data=BODIES[1]), Flat(data=BODIES[1])
    assert first.is_valid() and second.is_valid()
    for name, declared in Flat._declared_fields.items():
        assert first.fields[name] is not declared and first.fields[name] is not second.fields[name]
        assert first.fields[name].parent is first and second.fields[name].parent is second
        assert declared.parent is None and declared.field_name is None
    # A default is made anew for each body, never shared between requests.
    one, two = Flat(data=BODIES[0]), Flat(data=BODIES[0])
    assert one.is_valid() and two.is_valid()
    one.validated_data["other"]["x"] = 1
    assert two.validated_data["other"] == {}


def test_the_hot_paths_bodies_refuse_what_they_refused() -> None:
    answer = AnswerSerializer(data={"question_id": "q" * 65, "nonce": "n", "answers": "no"})
    assert not answer.is_valid()
    assert set(answer.errors) == {"question_id", "answers"}
    assert "Ensure this field has no more than 64 characters." in answer.errors["question_id"]
    action = PanelActionSerializer(data={"action": "answer"})
    assert action.is_valid() and action.validated_data == {"action": "answer", "data": {}}


def test_nested_serializers_are_refused_where_they_are_declared() -> None:
    class Inner(serializers.Serializer):
        name = serializers.CharField()

    with pytest.raises(TypeError, match="Outer.inner: a FlatSerializer takes plain fields only"):
        type("Outer", (FlatSerializer,), {"inner": Inner()})
    with pytest.raises(TypeError, match="Outer.inners"):
        type("Outer", (FlatSerializer,), {"inners": serializers.ListField(child=Inner())})
