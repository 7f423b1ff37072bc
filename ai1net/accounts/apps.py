from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "ai1net.accounts"
    label = "accounts"
    verbose_name = "Accounts"
