"""Open a browser WebSocket on the real ASGI application with a logged-in session."""

from __future__ import annotations

from channels.testing import WebsocketCommunicator

from ai1net.asgi import application


def session_cookie(client, user) -> str:
    client.force_login(user)
    return client.cookies["sessionid"].value


def communicator(path: str, session_key: str | None = None, origin: str = "http://testserver") -> WebsocketCommunicator:
    headers = [(b"origin", origin.encode()), (b"host", b"testserver")]
    if session_key:
        headers.append((b"cookie", f"sessionid={session_key}".encode()))
    return WebsocketCommunicator(application, path, headers=headers)
