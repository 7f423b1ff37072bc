from django.apps import AppConfig


class ImConfig(AppConfig):
    name = "im"
