from django.apps import AppConfig


class DevicesConfig(AppConfig):
    name = "devices"

    def ready(self) -> None:
        from django.utils.module_loading import autodiscover_modules

        # Each app's device -> platform request handlers (`<app>/rpc.py`, @device_method).
        autodiscover_modules("rpc")

        from ai1net import realtime
        from devices.web import relay

        # Outbox doorbells for a tunnel in another daphne process go straight to its stream relay.
        realtime.direct_sender = relay.send_to_tunnel
