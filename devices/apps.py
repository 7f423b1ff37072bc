from django.apps import AppConfig


class DevicesConfig(AppConfig):
    name = "devices"

    def ready(self) -> None:
        from django.utils.module_loading import autodiscover_modules

        # Each app's device -> platform request handlers (`<app>/rpc.py`, @device_method).
        autodiscover_modules("rpc")
        # Device-web bodies pass through buffers of up to 1 MiB: keep freed ones mapped (clients.memory), and
        # unmask what bridges send in one pass (devices.web.masking).
        from clients.memory import keep_freed_memory
        from devices.web import masking

        keep_freed_memory()
        masking.install()
