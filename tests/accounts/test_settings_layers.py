from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest
from django.conf import settings

from tests.e2e_support import ROOT


def _django_subprocess(code: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("AI1NET_") and k not in ("REDIS_URL",
                                                                                              "DATABASE_URL")}
    clean.update({"DJANGO_SETTINGS_MODULE": "ai1net.settings", **env})
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=clean, capture_output=True, text=True,
                          timeout=60)


PRINT_LAYER = (
    "import django; django.setup(); from django.conf import settings; "
    "print(settings.CHANNEL_LAYERS['default']['BACKEND']); print(settings.CACHES['default']['BACKEND'])"
)


def test_settings_pick_channels_redis_when_redis_url_set():
    result = _django_subprocess(PRINT_LAYER, REDIS_URL="redis://127.0.0.1:6399/3")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["ai1net.channel_layers.RedisChannelLayer",
                                     "ai1net.cache.SharedRedisCache"]


def test_settings_default_to_in_memory_layer():
    result = _django_subprocess(PRINT_LAYER)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["ai1net.channel_layers.InMemoryChannelLayer",
                                     "django.core.cache.backends.locmem.LocMemCache"]


def test_debug_off_without_secret_key_refuses_to_start():
    result = _django_subprocess("import django; django.setup()", AI1NET_DEBUG="0",
                                AI1NET_ALLOWED_HOSTS="example.org", AI1NET_PUBLIC_URL="https://example.org")
    assert result.returncode != 0
    assert "AI1NET_SECRET_KEY must be set" in result.stderr


def test_debug_off_without_allowed_hosts_refuses_to_start():
    result = _django_subprocess("import django; django.setup()", AI1NET_DEBUG="0", AI1NET_SECRET_KEY="k" * 50,
                                AI1NET_PUBLIC_URL="https://example.org")
    assert result.returncode != 0
    assert "AI1NET_ALLOWED_HOSTS must be set" in result.stderr


def test_debug_off_with_everything_starts_with_secure_cookies():
    code = ("import django; django.setup(); from django.conf import settings; "
            "print(settings.SESSION_COOKIE_SECURE, settings.CSRF_COOKIE_SECURE, settings.SESSION_COOKIE_HTTPONLY)")
    result = _django_subprocess(code, AI1NET_DEBUG="0", AI1NET_SECRET_KEY="k" * 50,
                                AI1NET_ALLOWED_HOSTS="example.org", AI1NET_PUBLIC_URL="https://example.org")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "True", "True"]


@pytest.mark.redis
@pytest.mark.skipif(not settings.REDIS_URL, reason="needs REDIS_URL")
async def test_message_crosses_two_redis_layer_instances():
    from ai1net.channel_layers import RedisChannelLayer

    config = settings.CHANNEL_LAYERS["default"]
    assert config["BACKEND"] == "ai1net.channel_layers.RedisChannelLayer"
    sender, receiver = RedisChannelLayer(**config["CONFIG"]), RedisChannelLayer(**config["CONFIG"])
    try:
        channel = await receiver.new_channel()
        group = f"accounts-test-{os.getpid()}"
        await receiver.group_add(group, channel)
        await sender.group_send(group, {"type": "test.ping", "text": "through redis"})
        message = await asyncio.wait_for(receiver.receive(channel), timeout=10)
        assert message == {"type": "test.ping", "text": "through redis"}
        await receiver.group_discard(group, channel)
    finally:
        await sender.close_pools()
        await receiver.close_pools()


@pytest.mark.django_db
def test_openapi_schema_served(client):
    response = client.get("/api/schema/")
    assert response.status_code == 200
    assert b"openapi" in response.content
    assert client.get("/api/docs/").status_code == 200
