from django.apps import AppConfig


class NotifyConfig(AppConfig):
    name = "notify"
    verbose_name = "Notifications"

    def ready(self) -> None:
        from notify import checks, receivers  # noqa: F401 - registers the deploy checks and the receivers
