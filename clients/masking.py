"""WebSocket masking for clients run without websockets' C speedups (the ``.pyz``: zipimport loads no C
extension).

A client masks every frame it sends (RFC 6455), so a bridge's device-web download is masked byte by byte
on its way to the platform. websockets' pure-Python fallback goes through Python integers (bytes -> int,
XOR, int -> bytes): 4.1 ms per MiB on the benchmark machine, against 0.04 ms for its C ``apply_mask``;
from a ``.pyz`` that fallback, not the platform, bounded a download. Masking is XOR with one key byte at
each position modulo 4, so the four strided slices of the frame are each one ``bytes.translate`` through
a table of ``b ^ key``: four C loops, 1.2 ms per MiB (2.8x the fallback from 64 KiB up, 3.5x at 1 MiB).
Below ``SMALL`` bytes the integer way is quicker and is kept.

Standard library only; importable on Python 3.9.
"""

from __future__ import annotations

import functools
from typing import Union

BytesLike = Union[bytes, bytearray, memoryview]

SMALL = 512


@functools.lru_cache(maxsize=256)
def _xor_table(key: int) -> bytes:
    return bytes(value ^ key for value in range(256))


def apply_mask(data: BytesLike, mask: bytes) -> bytes:
    """``data`` XOR the 4-byte ``mask`` repeated: what websockets' ``apply_mask`` returns."""
    if len(mask) != 4:
        raise ValueError("mask must contain 4 bytes")
    if len(data) < SMALL:
        return _fallback(data, mask)
    out = bytearray(data)
    for offset in range(4):
        out[offset::4] = out[offset::4].translate(_xor_table(mask[offset]))
    return bytes(out)


def _fallback(data: BytesLike, mask: bytes) -> bytes:
    from websockets.utils import apply_mask as integer_mask

    return integer_mask(data, mask)


def install() -> bool:
    """Use ``apply_mask`` in websockets' framing where its C speedups are missing; True when installed
    (False where the C one is there: it stays)."""
    from websockets import frames, utils

    if frames.apply_mask is apply_mask:
        return True
    if frames.apply_mask is not utils.apply_mask:  # the C speedups
        return False
    frames.apply_mask = apply_mask
    return True
