"""ai1net.handlers: Django's ASGI handler keeps its request threads (and their database connections)."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
from channels.testing import HttpCommunicator
from django.db import connection, connections
from django.http import JsonResponse
from django.urls import path

from ai1net.handlers import KeptThreadsASGIHandler

release = threading.Event()


def where(request):
    connection.ensure_connection()
    if request.GET.get("wait"):
        release.wait(10)
    return JsonResponse({"thread": threading.get_ident(), "connection": id(connection.connection)})


urlpatterns = [path("where", where)]


async def get(app, query: str = "") -> dict:
    communicator = HttpCommunicator(app, "GET", f"/where{query}", headers=[(b"host", b"127.0.0.1")])
    response = await communicator.get_response(10)
    await communicator.wait(5)  # the handler has given its thread back
    assert response["status"] == 200, response
    return json.loads(response["body"])


@pytest.fixture
def app():
    handler = KeptThreadsASGIHandler()
    yield handler
    for executor in handler._idle:  # the kept threads hold database connections: close them
        executor.submit(connections.close_all).result(10)
        executor.shutdown()


async def idle(app, count: int) -> None:
    """Wait until ``count`` executors are idle (each goes back once its thread is free)."""
    for _ in range(200):
        if len(app._idle) == count:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{len(app._idle)} idle executors, expected {count}")


@pytest.mark.urls("tests.test_asgi_handler")
@pytest.mark.django_db(transaction=True)
async def test_requests_one_after_another_share_a_thread_and_its_connection(app):
    seen = []
    for _ in range(3):
        seen.append(await get(app))
        await idle(app, 1)
    first, second, third = seen
    assert first["thread"] == second["thread"] == third["thread"]
    if connection.settings_dict["CONN_MAX_AGE"] is None:  # SQLite: the thread keeps its connection
        assert first["connection"] == second["connection"] == third["connection"]
    # (on PostgreSQL each request still returns its connection to the pool at the end, as before)
    assert first["thread"] != threading.get_ident()  # never the event loop's own thread


@pytest.mark.urls("tests.test_asgi_handler")
@pytest.mark.django_db(transaction=True)
async def test_requests_at_the_same_time_get_threads_of_their_own(app):
    release.clear()
    waiting = asyncio.ensure_future(get(app, "?wait=1"))
    await asyncio.sleep(0.2)
    other = await get(app)  # served while the first still holds its thread
    release.set()
    first = await waiting
    assert first["thread"] != other["thread"]
    await idle(app, 2)
    again = await get(app)
    assert again["thread"] in {first["thread"], other["thread"]}


@pytest.mark.urls("tests.test_asgi_handler")
@pytest.mark.django_db(transaction=True)
async def test_a_thread_still_busy_with_a_cancelled_request_serves_no_other_until_it_is_free(app):
    busy = await get(app)
    await idle(app, 1)
    release.clear()
    gone = HttpCommunicator(app, "GET", "/where?wait=1", headers=[(b"host", b"127.0.0.1")])
    await gone.send_input({"type": "http.request", "body": b""})
    await asyncio.sleep(0.2)  # the view now blocks in the kept thread
    await gone.send_input({"type": "http.disconnect"})  # the client goes away: Django cancels the request
    await asyncio.sleep(0.3)
    assert app._idle == []  # its thread is still inside the view
    started = asyncio.get_running_loop().time()
    other = await get(app)  # served at once, on a thread of its own
    assert asyncio.get_running_loop().time() - started < 5 and other["thread"] != busy["thread"]
    release.set()
    await gone.wait(5)
    await idle(app, 2)
