"""DRF serializers for the request bodies of the hot paths (an answer POST, a phone message, a panel action).

A DRF serializer deep-copies its declared fields on every instance: each field is built again from the
arguments it was declared with, validators included (``Field.__deepcopy__``). For the five fields of an
answer that was 185-211 µs of the 272-331 its validation took on a slow machine, and 14% of py-spy's samples
of the stack an answer POST runs before the answer itself (bench/NOTES.md has the runs). DRF rebuilds them
because a bound field keeps per-serializer state (``bind`` sets its name and parent, and a nested serializer
keeps its own fields). The declared fields themselves are never bound, and a plain field keeps nothing else
per request, so a flat serializer can copy each one a level deep instead and bind the copy.
"""

from __future__ import annotations

from typing import Any

from rest_framework import serializers


def _twin(field: serializers.Field) -> serializers.Field:
    # copy.copy, without its reduce protocol (half its time here): the same attributes in a new instance.
    twin = object.__new__(type(field))
    twin.__dict__.update(field.__dict__)
    return twin


class FlatSerializer(serializers.Serializer):
    """A serializer of plain fields only: no nested serializer, no composite field with one inside.

    A ``child`` (``DictField``, ``ListField``) is shared between the copies: it must be a plain field that
    needs no context (the default, unvalidated one or a scalar field)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name, field in cls._declared_fields.items():
            inner = [field, getattr(field, "child", None), getattr(field, "child_relation", None)]
            if any(isinstance(part, (serializers.BaseSerializer, serializers.RelatedField)) for part in inner):
                raise TypeError(f"{cls.__name__}.{name}: a FlatSerializer takes plain fields only "
                                f"(use serializers.Serializer for nested ones)")

    def get_fields(self) -> dict[str, serializers.Field]:
        return {name: _twin(field) for name, field in self._declared_fields.items()}
