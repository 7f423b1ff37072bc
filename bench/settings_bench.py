"""ai1net settings for the benchmark: optionally swap the Redis layer for RedisPubSubChannelLayer."""

import os

from ai1net.settings import *  # noqa: F403
from ai1net.settings import REDIS_PREFIX, REDIS_URL

# Measure what production runs: DEBUG off (with it on, every query is also formatted and kept in
# connection.queries). The production-only hardening that settings.py applies when debug is off
# (HTTPS redirect, secure cookies) stays off here: the benchmark speaks plain HTTP on loopback.
DEBUG = os.environ.get("BENCH_DEBUG") == "1"
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]

if REDIS_URL and os.environ.get("BENCH_LAYER") == "pubsub":
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
            "CONFIG": {
                "hosts": [{"address": REDIS_URL, "socket_timeout": None, "max_connections": 100_000}],
                "prefix": f"{REDIS_PREFIX}:pubsub",
            },
        }
    }
