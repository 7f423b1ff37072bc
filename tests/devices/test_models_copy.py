"""Device.copied: what copy.copy gives, without pickling's detour."""

from __future__ import annotations

import copy

import pytest
from django.db.utils import DJANGO_VERSION_PICKLE_KEY

from devices.models import Device
from devices.selectors import device_with_owner
from tests.mobile.factories import bridge_for

pytestmark = pytest.mark.django_db


def test_a_copy_has_the_same_fields_and_related_objects_and_a_state_of_its_own(user):
    device = device_with_owner(device_id=bridge_for(user).pk)
    clone, reference = device.copied(), copy.copy(device)
    assert clone is not device and type(clone) is Device
    assert set(clone.__dict__) == set(reference.__dict__) - {DJANGO_VERSION_PICKLE_KEY}  # copy.copy's pickling mark
    assert all(getattr(clone, f.attname) == getattr(device, f.attname) for f in Device._meta.concrete_fields)
    assert clone.owner is device.owner  # the related object cached as it was, as copy.copy keeps it
    assert clone._state is not device._state and clone._state.fields_cache is not device._state.fields_cache
    assert (clone._state.db, clone._state.adding) == (device._state.db, device._state.adding) == ("default", False)
    # What changes on the copy stays there (the hello's copy for device_connected's receivers relies on it).
    clone.next_seq += 5
    clone._state.fields_cache.clear()
    assert device.next_seq == reference.next_seq and "owner" in device._state.fields_cache
    clone.save(update_fields=["next_seq"])
    assert Device.objects.get(pk=device.pk).next_seq == device.next_seq + 5
