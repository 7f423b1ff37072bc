"""ai1net settings for the benchmark: optionally swap the Redis layer for RedisPubSubChannelLayer."""

import os

from ai1net.settings import *  # noqa: F403
from ai1net.settings import REDIS_PREFIX, REDIS_URL

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
