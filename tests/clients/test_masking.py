"""clients.masking: the .pyz's WebSocket masking gives websockets' bytes, and a .pyz client uses it."""

from __future__ import annotations

import os
import subprocess

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


def test_a_bridge_run_from_the_pyz_masks_with_it(built, tmp_path):  # noqa: F811
    script = ("import sys; sys.path.insert(0, sys.argv[1]); import clients.common.tunnel; "
              "from websockets import frames, utils; from clients import masking; "
              "print(frames.apply_mask is masking.apply_mask, utils.apply_mask is not masking.apply_mask)")
    result = subprocess.run([*BARE, "-c", script, str(built / "ai1net-bridge.pyz")], cwd=tmp_path,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "True"]
