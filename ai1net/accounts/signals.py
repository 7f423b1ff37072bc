"""Signals other apps listen to. ``switch_changed`` is sent after commit by ``user_switch_set``.

Receivers get ``sender=User, user=<User>, switch="mobile_reply"|"device_web", enabled=<bool>``.
"""

from django.dispatch import Signal

switch_changed = Signal()
