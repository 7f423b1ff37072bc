"""devices.web.masking: the one-pass unmasking gives autobahn's bytes, however a frame is cut into pieces."""

from __future__ import annotations

import os
import random

import pytest
from autobahn.nvx._xormasker import create_xor_masker as autobahn_masker

from devices.web import masking

pytest.importorskip("websockets.speedups")


def test_one_pass_unmasking_matches_autobahn_for_any_split():
    from websockets.speedups import apply_mask

    rng = random.Random(7)
    for _ in range(50):
        mask = os.urandom(4)
        payload = os.urandom(rng.randint(1, 300_000))
        ours, theirs = masking.OnePassMasker(mask, apply_mask), autobahn_masker(mask, len(payload))
        got, expected, offset = [], [], 0
        while offset < len(payload):
            piece = payload[offset:offset + rng.randint(1, 70_000)]
            offset += len(piece)
            got.append(ours.process(piece))
            expected.append(theirs.process(piece))
            assert ours.pointer() == theirs.pointer() == offset
        assert b"".join(got) == b"".join(expected)


def test_install_swaps_autobahns_factory_for_every_frame():
    from autobahn.websocket import protocol as autobahn_protocol

    assert masking.install() and masking.install()  # once, however often it is called
    factory = autobahn_protocol.create_xor_masker
    assert factory is not autobahn_masker
    for length in (1, 100, 4095, 1 << 20):
        assert isinstance(factory(b"abcd", length), masking.OnePassMasker)
