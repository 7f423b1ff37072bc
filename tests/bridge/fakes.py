"""A fake tunnel for the daemon's mobile logic: canned platform results, recorded calls."""

from __future__ import annotations

import asyncio

from clients.common.tunnel import RemoteError


def app_error(code: str, detail: str = "refused") -> RemoteError:
    return RemoteError(-32000, detail, {"code": code, "detail": detail})


class FakeTunnel:
    def __init__(self):
        self.calls: list[tuple[str, dict]] = []
        self.results: dict = {
            "mobile.session_start": {"room_id": "r1", "mobile_reply": True},
            "mobile.question": lambda p: {
                "question_id": p["question_id"],
                "state": "pending",
                "expires_at": "2030-01-01T00:00:00Z",
                "mobile_reply": True,
            },
        }
        self.called = asyncio.Event()

    async def call(self, method, params=None, timeout=30.0):
        self.calls.append((method, dict(params or {})))
        self.called.set()
        result = self.results.get(method, {})
        if callable(result):
            result = result(params)
        if isinstance(result, BaseException):
            raise result
        return result

    def methods(self) -> list[str]:
        return [method for method, _ in self.calls]

    def params(self, method: str) -> list[dict]:
        return [params for m, params in self.calls if m == method]
