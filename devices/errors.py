"""Errors of platform -> device calls (``device_call``), in the platform's one hierarchy."""

from __future__ import annotations

from ai1net.exceptions import ApplicationError, Unavailable


class DeviceOffline(Unavailable):
    code = "device_offline"
    status = 503
    default_detail = "The device is not connected."


class DeviceTimeout(ApplicationError):
    code = "device_timeout"
    status = 504
    default_detail = "The device did not answer in time."


class DeviceCallError(ApplicationError):
    """The device answered with a JSON-RPC error; ``code`` is its ``error.data.code`` or ``device_error``."""

    code = "device_error"
    status = 502
    default_detail = "The device reported an error."
