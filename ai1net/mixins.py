"""Per-object behaviour added by swapping an object's class for one with a mixin in front (daphne's HTTP channels,
ai1net.http_guard; their TCP transports, ai1net.soon_writes): each pair's class is made once and kept."""

from __future__ import annotations

import functools


@functools.cache
def mixed(mixin: type, cls: type) -> type:
    """``cls`` with ``mixin`` in front, named after both (``_GuardedChannel`` + ``HTTPChannel``: GuardedHTTPChannel)."""
    name = mixin.__name__.strip("_").removesuffix("Channel")
    return type(f"{name}{cls.__name__}", (mixin, cls), {"__module__": mixin.__module__})
