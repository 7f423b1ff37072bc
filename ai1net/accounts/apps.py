from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "ai1net.accounts"
    label = "accounts"
    verbose_name = "Accounts"

    def ready(self) -> None:
        from ai1net import checks  # noqa: F401 - registers the platform's system checks
