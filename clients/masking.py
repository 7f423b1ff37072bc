"""WebSocket masking for clients run without websockets' C speedups (the ``.pyz``: zipimport loads no C
extension).

A client masks every frame it sends (RFC 6455), so a bridge's device-web download is masked byte by byte
on its way to the platform. websockets' pure-Python fallback goes through Python integers (bytes -> int,
XOR, int -> bytes): 4.1 ms per MiB on the benchmark machine, against 0.04 ms for its C ``apply_mask``;
from a ``.pyz`` that fallback, not the platform, bounded a download. Masking is XOR with one key byte at
each position modulo 4, so the four strided slices of the frame are each one ``bytes.translate`` through
a table of ``b ^ key``: four C loops, 1.2 ms per MiB (2.8x the fallback from 64 KiB up, 3.5x at 1 MiB).
Below ``SMALL`` bytes the integer way is quicker and is kept.

Where the interpreter running a ``.pyz`` is the kind that built it (the same CPython version, machine and C
library: the file's name says so), the archive carries websockets' C masking too (``clients/build.py``), and
``install`` loads it from an anonymous in-memory file (Linux ``memfd``: nothing is written to disk): the bytes
the build read from its own websockets, which zipimport cannot load from inside a zip. Anywhere else, or when
anything in that fails, the translate masking above is used.

Standard library only; importable on Python 3.9.
"""

from __future__ import annotations

import functools
from typing import Callable, Optional, Union

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


def c_mask_from_archive() -> Optional[Callable[[BytesLike, bytes], bytes]]:
    """websockets' C ``apply_mask`` out of the ``.pyz`` this runs from (see the module's doc), or None: not
    run from an archive, no C masking in it for this interpreter, or it would not load here."""
    import importlib.machinery
    import importlib.util
    import os
    import zipimport

    import websockets

    loader, memfd_create = getattr(websockets, "__loader__", None), getattr(os, "memfd_create", None)
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]  # the full tag: '.cpython-311-x86_64-linux-gnu.so'
    if not isinstance(loader, zipimport.zipimporter) or memfd_create is None or not suffix.startswith(".cpython-"):
        return None
    try:
        data = loader.get_data(os.path.join(os.path.dirname(websockets.__file__), "speedups" + suffix))
    except OSError:  # built by another kind of interpreter, or without websockets' C part
        return None
    try:
        fd = memfd_create("ai1net-websockets-speedups")
    except OSError:  # e.g. executable memory files refused (vm.memfd_noexec)
        return None
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        # dlopen maps the file: once loaded, the descriptor may close.
        path = "/proc/self/fd/%d" % fd
        extension = importlib.machinery.ExtensionFileLoader("websockets.speedups", path)
        module = importlib.util.module_from_spec(importlib.machinery.ModuleSpec("websockets.speedups", extension,
                                                                                origin=path))
        extension.exec_module(module)
        c_mask = module.apply_mask
        if c_mask(b"\x00\x01\x02\x03\x04", b"abcd") != _fallback(b"\x00\x01\x02\x03\x04", b"abcd"):
            return None
        return c_mask
    except (ImportError, OSError, AttributeError, TypeError, ValueError):
        return None
    finally:
        os.close(fd)


def install() -> bool:
    """Use websockets' C masking from the ``.pyz`` where it loads, else ``apply_mask``, in websockets'
    framing where its C speedups are missing; True when installed (False where the C one was there from the
    start: it stays)."""
    global _from_archive
    from websockets import frames

    current = mode()
    if current != "integers":  # installed already, or the C speedups ("c"), which stay
        return current != "c"
    _from_archive = c_mask_from_archive()
    frames.apply_mask = _from_archive or apply_mask
    return True


def mode() -> str:
    """The masking websockets' framing uses in this process: "c", "c from the archive", "translate" or
    "integers" (before ``install``, without the C speedups)."""
    from websockets import frames, utils

    if _from_archive is not None and frames.apply_mask is _from_archive:
        return "c from the archive"
    if frames.apply_mask is apply_mask:
        return "translate"
    return "integers" if frames.apply_mask is utils.apply_mask else "c"


_from_archive: Optional[Callable[[BytesLike, bytes], bytes]] = None  # what install() loaded from the .pyz
