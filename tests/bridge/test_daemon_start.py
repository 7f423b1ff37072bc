"""``ai1net-bridge run``: what happens before the daemon's event loop starts."""

from __future__ import annotations

import gc

from clients.bridge import cli, daemon
from clients.common.credentials import Credential, save_credential


def test_run_freezes_what_start_up_imported_before_the_daemon_starts(tmp_path, monkeypatch):
    save_credential(tmp_path, Credential(url="http://127.0.0.1:9", device_id="d", token="ai1d_x", kind="bridge",
                                         name="desk"))
    seen = []

    class StartedDaemon:
        def __init__(self, home, cred, expose=None):
            pass

        async def run(self) -> int:
            seen.append(gc.get_freeze_count())
            return 0

    monkeypatch.setattr(daemon, "BridgeDaemon", StartedDaemon)
    gc.unfreeze()
    try:
        assert cli.main(["--home", str(tmp_path), "run"]) == 0
    finally:
        gc.unfreeze()
    assert seen and seen[0] > 1000  # the daemon's modules, websockets, asyncio: out of full collections
