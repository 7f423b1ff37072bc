"""A local service for device-web tests and the benchmark: ``python upstream.py HTTP_PORT [WS_PORT]``.

Standard library (+ websockets for the WebSocket port); binds 127.0.0.1 only. HTTP routes:
  /echo...            JSON {method, target, headers, body_len, body_sha256} (any method; body streamed)
  /bytes?n=N          N pattern bytes with Content-Length (``&chunked=1``: chunked encoding)
  /sse?count=N&gap=S  text/event-stream, one event every S seconds, each flushed as it is written
  /small              a 2-byte body ("ok")
  /hang               never answers (until the client goes away)
  /hits               how many other requests this server has seen (JSON)
WebSocket port: echoes text and binary messages; "close:<code>" closes with that code.
Prints "ready" once both ports listen.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
import time
from urllib.parse import parse_qs, urlsplit

BLOCK = bytes(range(256)) * 256  # 64 KiB of a fixed pattern


def pattern(n: int):
    """The body /bytes?n=N sends, in blocks (the tests hash the same)."""
    while n > 0:
        piece = BLOCK[: min(n, len(BLOCK))]
        n -= len(piece)
        yield piece


HITS = 0


async def read_body(reader: asyncio.StreamReader, headers: dict[str, str]):
    if "chunked" in headers.get("transfer-encoding", "").lower():
        while True:
            size = int((await reader.readline()).split(b";")[0].strip(), 16)
            if size == 0:
                while (await reader.readline()).strip():
                    pass
                return
            remaining = size
            while remaining:
                data = await reader.read(min(remaining, 65536))
                if not data:
                    raise ConnectionError("early end")
                remaining -= len(data)
                yield data
            await reader.readline()
    remaining = int(headers.get("content-length", "0") or 0)
    while remaining:
        data = await reader.read(min(remaining, 65536))
        if not data:
            raise ConnectionError("early end")
        remaining -= len(data)
        yield data


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    global HITS
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()
        return
    lines = head.decode("latin-1").split("\r\n")
    method, target, _ = lines[0].split(" ", 2)
    header_list = [line.split(":", 1) for line in lines[1:] if line]
    header_list = [[k.strip(), v.strip()] for k, v in header_list]
    headers = {k.lower(): v for k, v in header_list}
    url = urlsplit(target)
    query = {k: v[0] for k, v in parse_qs(url.query).items()}
    HITS += url.path != "/hits"
    try:
        if url.path.startswith("/echo"):
            digest, size = hashlib.sha256(), 0
            async for data in read_body(reader, headers):
                digest.update(data)
                size += len(data)
            body = json.dumps({"method": method, "target": target, "headers": header_list, "body_len": size,
                               "body_sha256": digest.hexdigest()}).encode()
            await respond(writer, 200, [("Content-Type", "application/json"), ("Set-Cookie", "sessionid=evil; Path=/"),
                                        ("Set-Cookie", "app=1; Path=/"), ("X-Upstream", "yes")], body)
        elif url.path == "/bytes":
            n = int(query.get("n", "0"))
            if query.get("chunked"):
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
                             b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
                for piece in pattern(n):
                    writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                    await writer.drain()
                writer.write(b"0\r\n\r\n")
            else:
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
                             b"Content-Length: %d\r\nConnection: close\r\n\r\n" % n)
                for piece in pattern(n):
                    writer.write(piece)
                    await writer.drain()
        elif url.path == "/sse":
            count, gap = int(query.get("count", "5")), float(query.get("gap", "0.3"))
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                         b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
            await writer.drain()
            for i in range(count):
                if i:
                    await asyncio.sleep(gap)
                event = f"data: {i} {time.time():.6f}\n\n".encode()
                writer.write(b"%x\r\n%s\r\n" % (len(event), event))
                await writer.drain()
            writer.write(b"0\r\n\r\n")
        elif url.path == "/hang":  # reads the request, never answers
            await reader.read()
        elif url.path == "/small":
            await respond(writer, 200, [("Content-Type", "text/plain")], b"ok")
        elif url.path == "/hits":
            await respond(writer, 200, [("Content-Type", "application/json")], json.dumps({"hits": HITS}).encode())
        else:
            await respond(writer, 404, [("Content-Type", "text/plain")], b"no such page")
        await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()


async def respond(writer: asyncio.StreamWriter, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
    head = [f"HTTP/1.1 {status} {'OK' if status == 200 else 'Not Found'}", f"Content-Length: {len(body)}",
            "Connection: close", *(f"{k}: {v}" for k, v in headers)]
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)


async def ws_echo(ws) -> None:
    from websockets.exceptions import ConnectionClosed

    try:
        async for message in ws:
            if isinstance(message, str) and message.startswith("close:"):
                await ws.close(int(message.split(":", 1)[1]), "asked to")
                return
            await ws.send(message)
    except ConnectionClosed:
        pass


async def main() -> None:
    http_port = int(sys.argv[1])
    server = await asyncio.start_server(handle, "127.0.0.1", http_port, limit=256 * 1024)
    ws_server = None
    if len(sys.argv) > 2:
        from websockets.asyncio.server import serve

        ws_server = await serve(ws_echo, "127.0.0.1", int(sys.argv[2]), max_size=2 ** 22)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()
    if ws_server is not None:
        ws_server.close()


if __name__ == "__main__":
    asyncio.run(main())
