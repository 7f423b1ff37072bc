"""ai1net.handlers: Django's ASGI handler keeps its request threads (and their database connections)."""

from __future__ import annotations

import asyncio
import json
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from channels.testing import HttpCommunicator
from django.core.signals import request_finished, request_started
from django.db import connection, connections
from django.http import JsonResponse, StreamingHttpResponse
from django.urls import get_resolver, path
from django.views.decorators.csrf import csrf_exempt

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


# --- one hop per request --------------------------------------------------------------------------

class CountingExecutor(ThreadPoolExecutor):
    """A request thread that counts the calls handed to it: each is one hop from the event loop."""

    def __init__(self) -> None:
        super().__init__(max_workers=1, thread_name_prefix="django-request")
        self.calls = 0

    def submit(self, *args, **kwargs):
        self.calls += 1
        return super().submit(*args, **kwargs)


trace: list[tuple[str, int]] = []


@csrf_exempt
def traced_view(request):
    trace.append(("view", threading.get_ident()))
    return JsonResponse({"ok": True})


@csrf_exempt
async def coroutine_view(request):
    trace.append(("coroutine view", threading.get_ident()))
    return JsonResponse({"ok": True})


@csrf_exempt
def streaming_view(request):
    async def body():  # (a sync iterator would be read whole into memory first, with a warning)
        yield b"first "
        trace.append(("last chunk", threading.get_ident()))
        yield b"last"

    return StreamingHttpResponse(body())


@csrf_exempt
def counted_view(request, n):
    seen = dict(request.resolver_match.kwargs)
    request.resolver_match.kwargs["n"] = -1  # a view changing its match changes no other request's
    return JsonResponse({"n": n, "seen": seen})


urlpatterns += [path("traced", traced_view), path("coroutine", coroutine_view), path("streaming", streaming_view),
                path("counted/<int:n>", counted_view)]


@pytest.fixture
def traced():
    trace.clear()

    def started(**kwargs):
        trace.append(("request_started", threading.get_ident()))

    def finished(**kwargs):
        trace.append(("request_finished", threading.get_ident()))

    request_started.connect(started)
    request_finished.connect(finished)
    yield trace
    request_started.disconnect(started)
    request_finished.disconnect(finished)


async def fetch(app, path: str) -> dict:
    communicator = HttpCommunicator(app, "POST", path, body=b'{"a": 1}',
                                    headers=[(b"host", b"127.0.0.1"), (b"content-type", b"application/json")])
    response = await communicator.get_response(10)
    await communicator.wait(5)
    return response


@pytest.mark.urls("tests.test_asgi_handler")
@pytest.mark.django_db(transaction=True)
async def test_a_sync_view_its_middleware_and_the_request_signals_run_in_one_hop(app, traced):
    executor = CountingExecutor()
    app._idle.append(executor)
    response = await fetch(app, "/traced")
    assert response["status"] == 200 and json.loads(response["body"]) == {"ok": True}
    assert [name for name, _ in traced] == ["request_started", "view", "request_finished"]
    assert len({thread for _, thread in traced}) == 1 and traced[0][1] != threading.get_ident()
    assert executor.calls == 1  # Django's async chain made a dozen (each middleware hook, the signals, the view)
    assert app._idle == [executor]  # lent again


@pytest.mark.urls("tests.test_asgi_handler")
@pytest.mark.django_db(transaction=True)
async def test_a_coroutine_view_keeps_djangos_async_path_and_runs_on_the_event_loop(app, traced):
    response = await fetch(app, "/coroutine")
    assert response["status"] == 200
    assert ("coroutine view", threading.get_ident()) in traced  # no thread held while it waits


@pytest.mark.urls("tests.test_asgi_handler")
@pytest.mark.django_db(transaction=True)
async def test_the_event_loop_resolves_a_path_once_to_choose_the_sync_or_async_path(app, traced, monkeypatch):
    from ai1net import handlers

    resolved: list[str] = []

    class CountingResolver:
        def __init__(self, urlconf):
            self.inner = get_resolver(urlconf)

        def resolve(self, url):
            resolved.append(url)
            return self.inner.resolve(url)

    monkeypatch.setattr(handlers, "get_resolver", CountingResolver)
    handlers._resolve_cached.cache_clear()
    for url in ["/traced", "/coroutine", "/traced", "/coroutine", "/traced"]:
        assert (await fetch(app, url))["status"] == 200
    assert sorted(resolved) == ["/coroutine", "/traced"]
    on_the_loop = [name for name, thread in traced if thread == threading.get_ident()]
    assert on_the_loop == ["coroutine view"] * 2  # each still takes its own path
    assert [name for name, _ in traced].count("view") == 3


@pytest.mark.urls("tests.test_asgi_handler")
@pytest.mark.django_db(transaction=True)
async def test_each_request_gets_its_own_copy_of_a_cached_match(app):
    for _ in range(3):
        response = await fetch(app, "/counted/7")
        assert json.loads(response["body"]) == {"n": 7, "seen": {"n": 7}}
    assert json.loads((await fetch(app, "/counted/8"))["body"]) == {"n": 8, "seen": {"n": 8}}


def test_long_paths_are_resolved_each_time_and_not_kept():
    from ai1net import handlers

    handlers._resolve_cached.cache_clear()
    long_path = "/api/" + "x" * handlers.CACHED_PATH_MAX
    assert handlers._resolved("ai1net.urls", long_path) is None
    assert handlers._resolved("ai1net.urls", "/healthz") is not None
    assert handlers._resolve_cached.cache_info().currsize == 1


@pytest.mark.urls("tests.test_asgi_handler")
@pytest.mark.django_db(transaction=True)
async def test_a_streaming_response_finishes_the_request_after_its_last_chunk(app, traced):
    communicator = HttpCommunicator(app, "GET", "/streaming", headers=[(b"host", b"127.0.0.1")])
    await communicator.send_input({"type": "http.request", "body": b""})
    start = await communicator.receive_output(10)
    body = b""
    while True:
        message = await communicator.receive_output(10)
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    await communicator.wait(5)
    assert start["status"] == 200 and body == b"first last"
    names = [name for name, _ in traced]
    assert names.index("last chunk") < names.index("request_finished")


@pytest.mark.urls("tests.test_asgi_handler")
@pytest.mark.django_db(transaction=True)
async def test_an_unknown_url_is_djangos_404_through_the_middleware(app):
    response = await fetch(app, "/nowhere")
    assert response["status"] == 404
    assert (b"x-frame-options", b"DENY") in [(k.lower(), v) for k, v in response["headers"]]


def test_the_served_application_freezes_its_start_up_heap():
    """Full collections skip what start-up built (ai1net.asgi): 85 ms of a daphne heap became 11 ms."""
    import subprocess
    import sys

    def frozen(program: str) -> int:
        script = f"import sys; sys.argv[0] = {program!r}; import ai1net.asgi, gc; print(gc.get_freeze_count())"
        return int(subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                                  timeout=60).stdout)

    assert frozen("/srv/venv/bin/daphne") > 10_000  # served by daphne: Django and the apps, tens of thousands
    assert frozen("/srv/venv/lib/python3.11/site-packages/daphne/__main__.py") > 10_000  # python -m daphne
    assert frozen("-c") == 0  # imported elsewhere (a test run, a command): nothing frozen


def test_the_application_module_tunes_device_web_and_django_setup_alone_does_not():
    """One-pass unmasking (devices.web.masking) comes with the served app, not with every management command."""
    import subprocess
    import sys

    def one_pass(imports: str) -> bool:
        script = (f"import {imports}; from autobahn.websocket import protocol; "
                  "print(getattr(protocol.create_xor_masker, 'one_pass', False))")
        return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                              timeout=60).stdout.strip() == "True"

    assert one_pass("ai1net.asgi")
    assert not one_pass("django, os; os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'ai1net.settings'); "
                        "django.setup(); import devices.models")


# --- a commit's doorbells ride on the request's one hop back ---------------------------------------

@csrf_exempt
def sending_view(request):
    from django.db import transaction

    from ai1net import realtime

    with transaction.atomic():
        realtime.group_send_on_commit("handler-test", {"type": "note", "n": 1})
        realtime.group_send_on_commit("handler-test", {"type": "note", "n": 2})
    if request.GET.get("wait"):
        release.wait(10)
    with transaction.atomic():
        realtime.group_send_on_commit("handler-test", {"type": "note", "n": 3})
    return JsonResponse({"ok": True})


urlpatterns += [path("sending", sending_view)]


@pytest.fixture
async def listener():
    from channels.layers import get_channel_layer

    layer = get_channel_layer()
    channel = await layer.new_channel()
    await layer.group_add("handler-test", channel)
    yield layer, channel
    await layer.group_discard("handler-test", channel)


async def notes(layer, channel, count: int) -> list[int]:
    return [(await asyncio.wait_for(layer.receive(channel), 10))["n"] for _ in range(count)]


@pytest.mark.urls("tests.test_asgi_handler")
@pytest.mark.django_db(transaction=True)
async def test_a_views_commits_wake_the_event_loop_once_when_its_thread_returns(app, listener, monkeypatch):
    """Each call_soon_threadsafe from the request's thread woke the loop, which then took the GIL from the
    thread still finishing the request; the sends are now handed over with the thread's result."""
    layer, channel = listener
    loop = asyncio.get_running_loop()
    woken_by: list[str] = []
    original = loop.call_soon_threadsafe

    def counting(callback, *args, **kwargs):
        woken_by.append(getattr(callback, "__qualname__", repr(callback)))
        return original(callback, *args, **kwargs)

    monkeypatch.setattr(loop, "call_soon_threadsafe", counting)
    response = await fetch(app, "/sending")
    assert response["status"] == 200
    assert await notes(layer, channel, 3) == [1, 2, 3]  # all of them, in order
    assert "_hand_over" not in woken_by, woken_by


@pytest.mark.urls("tests.test_asgi_handler")
@pytest.mark.django_db(transaction=True)
async def test_a_cancelled_requests_commits_are_still_sent_when_its_thread_is_done(app, listener):
    layer, channel = listener
    release.clear()
    gone = HttpCommunicator(app, "POST", "/sending?wait=1", headers=[(b"host", b"127.0.0.1")])
    await gone.send_input({"type": "http.request", "body": b""})
    await asyncio.sleep(0.3)  # two sends committed, the view waits
    gone.future.cancel()  # as daphne cancels an application whose client left long ago
    await asyncio.sleep(0.3)
    release.set()  # the view goes on, commits the third
    assert await notes(layer, channel, 3) == [1, 2, 3]
    assert app._idle == []  # and its thread is never lent again


@pytest.mark.urls("tests.test_asgi_handler")
@pytest.mark.django_db(transaction=True)
async def test_the_response_is_written_before_the_doorbells_leave(app, monkeypatch):
    from ai1net import realtime

    order: list[str] = []
    monkeypatch.setattr(realtime, "_hand_over", lambda loop, group, message: order.append(f"send {message['n']}"))
    received = [{"type": "http.request", "body": b"", "more_body": False}]

    async def receive():
        return received.pop(0) if received else await asyncio.Event().wait()

    async def send(message):
        order.append(message["type"])

    scope = {"type": "http", "method": "POST", "path": "/sending", "raw_path": b"/sending", "query_string": b"",
             "headers": [(b"host", b"127.0.0.1")], "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}
    await app(scope, receive, send)
    assert order == ["http.response.start", "http.response.body", "send 1", "send 2", "send 3"], order
