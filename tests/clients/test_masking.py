"""clients.masking: the .pyz's WebSocket masking gives websockets' bytes, and a .pyz client uses it."""

from __future__ import annotations

import os
import subprocess
import zipfile
from importlib.machinery import EXTENSION_SUFFIXES

import pytest
from websockets.frames import OP_BINARY, Frame
from websockets.speedups import apply_mask as c_apply_mask
from websockets.utils import apply_mask as integer_apply_mask

from clients import masking
from tests.clients.test_build import BARE, built  # noqa: F401  (the fixture)


@pytest.mark.parametrize("size", [0, 1, 3, 4, 5, 511, 512, 513, 4095, 65536 + 3, (1 << 20) + 1])
def test_the_same_bytes_as_websockets_c_masking(size):
    for _ in range(3):
        data, mask = os.urandom(size), os.urandom(4)
        expected = c_apply_mask(data, mask)
        assert masking.apply_mask(data, mask) == expected == integer_apply_mask(data, mask)
        assert masking.apply_mask(memoryview(data), mask) == expected
        assert masking.apply_mask(bytearray(data), mask) == expected
        assert type(masking.apply_mask(data, mask)) is bytes
    assert masking.apply_mask(masking.apply_mask(data, mask), mask) == data  # its own inverse
    with pytest.raises(ValueError):
        masking.apply_mask(data, b"abc")


def test_a_masked_frame_parses_back_with_it(monkeypatch):
    from websockets import frames

    monkeypatch.setattr(frames, "apply_mask", integer_apply_mask)  # as in a .pyz
    assert masking.install() and frames.apply_mask is masking.apply_mask and masking.install()
    payload = os.urandom(200_000)
    wire = Frame(OP_BINARY, payload).serialize(mask=True)
    assert wire[1] & 0x80 and payload not in wire

    def read_exact(n: int):
        nonlocal wire
        chunk, wire = wire[:n], wire[n:]
        return chunk
        yield  # a generator, as websockets' reader is

    parser = Frame.parse(read_exact, mask=True)
    with pytest.raises(StopIteration) as done:
        next(parser)
    assert done.value.value.data == payload


def test_the_c_masking_stays_where_it_is_there(monkeypatch):
    from websockets import frames

    monkeypatch.setattr(frames, "apply_mask", c_apply_mask)
    assert masking.install() is False and frames.apply_mask is c_apply_mask


# Run from a .pyz on a bare interpreter: the tunnel's import installs the masking; which one, and its bytes.
PYZ_MASKING = (
    "import os, sys; sys.path.insert(0, sys.argv[1]); import clients.common.tunnel; "
    "from websockets import frames, utils; from websockets.frames import Frame, OP_BINARY; "
    "from clients import masking; data, mask = os.urandom(300_000), os.urandom(4); "
    "print(masking.mode()); print(frames.apply_mask(data, mask) == utils.apply_mask(data, mask)); "
    "wire = Frame(OP_BINARY, data).serialize(mask=True); "
    "print(utils.apply_mask(wire[-len(data):], wire[-len(data) - 4:-len(data)]) == data)"
)


def pyz_masking(pyz, cwd) -> list[str]:
    result = subprocess.run([*BARE, "-c", PYZ_MASKING, str(pyz)], cwd=cwd, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout.split("\n")[:3]


def test_a_bridge_run_from_the_pyz_masks_with_websockets_c_masking_it_carries(built, tmp_path):  # noqa: F811
    assert pyz_masking(built / "ai1net-bridge.pyz", tmp_path) == ["c from the archive", "True", "True"]
    assert pyz_masking(built / "ai1net-probe.pyz", tmp_path) == ["c from the archive", "True", "True"]


def rewritten(pyz, target, name: str, data: bytes | None):
    """A copy of ``pyz`` with the archive member ``name`` replaced by ``data`` (or left out: None)."""
    with zipfile.ZipFile(pyz) as source, zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as copy:
        for item in source.infolist():
            if item.filename != name:
                copy.writestr(item, source.read(item))
            elif data is not None:
                copy.writestr(item, data)
    return target


@pytest.mark.parametrize("case", ["missing", "not a shared object", "another interpreter's"])
def test_where_the_archives_c_masking_is_no_use_the_translate_masking_does_it(built, tmp_path, case):  # noqa: F811
    pyz, name = built / "ai1net-bridge.pyz", f"websockets/speedups{EXTENSION_SUFFIXES[0]}"
    if case == "missing":
        target = rewritten(pyz, tmp_path / "a.pyz", name, None)
    elif case == "not a shared object":
        target = rewritten(pyz, tmp_path / "a.pyz", name, b"\x7fELF but not really" * 100)
    else:  # the same file under another version's tag: this interpreter does not look for it
        target = rewritten(pyz, tmp_path / "b.pyz", name, None)
        with zipfile.ZipFile(pyz) as source, zipfile.ZipFile(target, "a") as copy:
            copy.writestr("websockets/speedups.cpython-399-x86_64-linux-gnu.so", source.read(name))
    assert pyz_masking(target, tmp_path) == ["translate", "True", "True"]
