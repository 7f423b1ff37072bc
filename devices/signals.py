"""Sent by the tunnel consumer after presence is written (receivers run in a worker thread)."""

from django.dispatch import Signal

# kwargs: device (Device), hello (dict: the hello params as sent)
device_connected = Signal()
# kwargs: device (Device)
device_disconnected = Signal()
