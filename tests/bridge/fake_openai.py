"""A scripted stand-in for the OpenAI Responses API on 127.0.0.1, enough for the real Codex CLI.

Codex (a custom ``[model_providers.X]`` with ``base_url`` and ``wire_api = "responses"``) POSTs
``<base_url>/responses`` and reads Server-Sent Events until ``response.completed``; it needs no more
than ``response.created``, one ``response.output_item.done`` per output item (a ``function_call`` or an
assistant ``message``) and ``response.completed``. Each POST takes the next step of the script (the
last one repeats); every request body is kept for the test to read (``requests``).
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def call(name: str, arguments: dict[str, Any], call_id: str) -> dict[str, Any]:
    """A step: the model calls tool ``name`` (Codex's shell tool is ``exec_command``, argument ``cmd``)."""
    return {"type": "function_call", "name": name, "arguments": json.dumps(arguments), "call_id": call_id}


def say(text: str) -> dict[str, Any]:
    """A step: the model answers with ``text`` and the turn ends."""
    return {"type": "message", "role": "assistant", "id": "msg_fake",
            "content": [{"type": "output_text", "text": text}]}


class FakeResponsesApi:
    def __init__(self, steps: list[dict[str, Any]]) -> None:
        self.steps = list(steps)
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's signature
                pass

            def do_GET(self) -> None:  # noqa: N802 - the stdlib's name; model lists and the like: nothing here
                self._send(404, "application/json", b'{"error": "not_found"}')

            def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if not self.path.endswith("/responses"):
                    self._send(404, "application/json", b'{"error": "not_found"}')
                    return
                item = api._next(json.loads(body))
                events = [
                    {"type": "response.created", "response": {"id": "resp_fake"}},
                    {"type": "response.output_item.done", "item": item},
                    {"type": "response.completed", "response": {"id": "resp_fake", "usage": {
                        "input_tokens": 1, "output_tokens": 1, "total_tokens": 2}}},
                ]
                stream = "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events)
                self._send(200, "text/event-stream", stream.encode("utf-8"))

            def _send(self, status: int, content_type: str, data: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def _next(self, request: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            self.requests.append(request)
            return self.steps.pop(0) if len(self.steps) > 1 else self.steps[0]

    def tool_outputs(self) -> dict[str, str]:
        """call_id -> what the tool returned to the model (the ``function_call_output`` items sent back)."""
        outputs: dict[str, str] = {}
        for request in self.requests:
            for item in request.get("input") or []:
                if isinstance(item, dict) and item.get("type") == "function_call_output":
                    output = item.get("output")
                    outputs[item["call_id"]] = output if isinstance(output, str) else json.dumps(output)
        return outputs

    def __enter__(self) -> FakeResponsesApi:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()
