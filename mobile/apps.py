from django.apps import AppConfig


class MobileConfig(AppConfig):
    name = "mobile"

    def ready(self) -> None:
        from im import panels
        from mobile import receivers  # noqa: F401 - connects the signal receivers
        from mobile.panels import question_panel_action

        panels.register("mobile.question", question_panel_action)
