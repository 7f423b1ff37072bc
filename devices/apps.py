from django.apps import AppConfig


class DevicesConfig(AppConfig):
    name = "devices"

    def ready(self) -> None:
        from django.utils.module_loading import autodiscover_modules

        # Each app's device -> platform request handlers (`<app>/rpc.py`, @device_method).
        autodiscover_modules("rpc")
