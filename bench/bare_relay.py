"""The least a dial-out relay does for device web, in two processes: what the path costs any implementation.

    python bench/bare_relay.py front HTTP_PORT WS_PORT      # the platform's place: browsers in, the device's socket
    python bench/bare_relay.py device WS_PORT LOCAL_PORT    # the device's place: dials out, reaches 127.0.0.1:LOCAL_PORT

What device web must do at the least, with the libraries the clients use and nothing else: a browser's request
reaches a server process, which hands it over a WebSocket the device opened (the device only dials out) to a
device process, which connects to the local service and sends back what it answers, in binary frames, for the
server process to write to the browser. No Django, no database, no login or access checks, no parsing of the
response, no flow control of its own (the sockets' buffers only), one device and GETs without a body. Its
sockets are sent without pacing as the platform's and the bridge's are (clients.common.loopback). Frames:
one kind byte (OPEN, DATA, END), a 4-byte stream number, then the request head or the response's bytes as they
came. Each browser connection carries one request and is closed after it, as the bench's local service does.

bench/deviceweb.py measures the same download, first byte and small requests through it in the same run as
through the tunnel and direct. Its first byte and small requests are a floor for this path on the machine:
beyond them is the platform's own work (sessions, access checks, headers, flow control). Its download is not:
websockets and stream readers copy every frame a few times, where the platform's bridge and daphne do not.
"""

from __future__ import annotations

import asyncio
import itertools
import sys
from pathlib import Path

from websockets.asyncio.client import connect
from websockets.asyncio.server import ServerConnection, serve

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from clients.common import loopback  # noqa: E402

OPEN, DATA, END = 0, 1, 2
READ_BYTES = 1024 * 1024  # the most one DATA frame carries (as the bridge's binary web.data)
HOST = "127.0.0.1"


def frame(kind: int, stream: int, payload: bytes = b"") -> bytes:
    return bytes((kind,)) + stream.to_bytes(4, "big") + payload


async def front(http_port: int, ws_port: int) -> None:
    device: asyncio.Future[ServerConnection] = asyncio.get_running_loop().create_future()
    writers: dict[int, asyncio.StreamWriter] = {}
    numbers = itertools.count(1)

    async def from_device(connection: ServerConnection) -> None:
        if device.done():
            await connection.close(1008, "one device")
            return
        device.set_result(connection)
        loopback.unpaced(connection.transport.get_extra_info("socket"))
        async for message in connection:
            kind, stream, payload = message[0], int.from_bytes(message[1:5], "big"), memoryview(message)[5:]
            writer = writers.get(stream)
            if writer is None:
                continue
            if kind == DATA:
                writer.write(payload)
                await writer.drain()
            else:
                del writers[stream]
                writer.close()

    async def from_browser(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        loopback.unpaced(writer.get_extra_info("socket"))
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            writer.close()
            return
        stream = next(numbers)
        writers[stream] = writer
        await (await device).send(frame(OPEN, stream, head))

    async with serve(from_device, HOST, ws_port, max_size=None, compression=None), \
            await asyncio.start_server(from_browser, HOST, http_port):
        print("ready", flush=True)
        await asyncio.Future()


async def device(ws_port: int, local_port: int) -> None:
    async with connect(f"ws://{HOST}:{ws_port}/", max_size=None, compression=None) as tunnel:
        loopback.unpaced(tunnel.transport.get_extra_info("socket"))

        async def answer(stream: int, head: bytes) -> None:
            reader, writer = await asyncio.open_connection(HOST, local_port, limit=READ_BYTES)
            loopback.unpaced(writer.get_extra_info("socket"))
            writer.write(head)
            while data := await reader.read(READ_BYTES):
                await tunnel.send(frame(DATA, stream, data))
            writer.close()
            await tunnel.send(frame(END, stream))

        tasks = set()
        async for message in tunnel:
            task = asyncio.create_task(answer(int.from_bytes(message[1:5], "big"), bytes(message[5:])))
            tasks.add(task)
            task.add_done_callback(tasks.discard)


if __name__ == "__main__":
    role, first, second = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    asyncio.run(front(first, second) if role == "front" else device(first, second))
