"""Django's ASGI handler, run as a WSGI server runs Django: one thread hop per request, threads kept.

Two costs of Django's own ASGI handler lead a py-spy profile of a bare API POST on daphne:

- **Hops.** Under ASGI, Django builds its middleware chain in async mode. Our middleware (Django's,
  django-otp's, ours) is synchronous code, so every ``process_request``/``process_response`` of it, the
  ``request_started`` receivers, the view and ``response.close()`` each cross from the event loop to the
  request's thread and back: about a dozen hops per request, each a queue, a thread wake-up and an event
  loop wake-up (half the event loop's time per request). A request for a synchronous view here makes
  *one* hop: ``request_started``, the request object, the whole middleware chain (built in sync mode, as
  under WSGI), the view and, for a response already in memory, ``response.close()`` (``request_finished``)
  run in the request's thread in one call; the loop then writes the response. Views that are coroutines
  (the long-poll) keep Django's async path, so a waiting request never holds a thread.
- **Threads.** Without an executor of its own, ``ThreadSensitiveContext()`` starts a new thread for
  every request, and database connections are per thread: every request also opened a new connection
  (on SQLite a connect and its PRAGMAs). Here each request borrows an idle single-thread executor
  (making one when none is idle) and gives it back when done, so a thread and its connection serve one
  request after another; there are never more threads than requests that ran at the same time.
  Connections still go through ``request_started``/``request_finished`` (``CONN_MAX_AGE``, health
  checks) as under WSGI.
- **Wake-ups.** What the request's thread hands to the event loop after a commit (doorbells, the outbox's
  direct path) is collected and run by the loop when the thread's result arrives: one wake-up per request
  instead of one per send, each of which let the loop take the GIL from the thread still finishing the
  request (``ai1net.realtime.LoopCalls``).
"""

from __future__ import annotations

import asyncio
import functools
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import django
from asgiref.sync import ThreadSensitiveContext, iscoroutinefunction, sync_to_async
from django.conf import settings
from django.core import signals
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.core.handlers.base import BaseHandler
from django.http import FileResponse, HttpRequest, HttpResponseBase
from django.urls import Resolver404, ResolverMatch, get_resolver, set_script_prefix, set_urlconf

from ai1net import realtime


class KeptThreadsASGIHandler(ASGIHandler):
    urlconf: str | None = None  # None: settings.ROOT_URLCONF (a subclass may serve other URLs)

    def __init__(self) -> None:
        super().__init__()  # Django's async chain, for coroutine views
        self._sync_chain = _SyncChain()
        self._sync_chain.load_middleware(is_async=False)  # the same middleware, built as under WSGI
        self._idle: list[ThreadPoolExecutor] = []  # touched on the event loop only

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            raise ValueError(f"Django can only handle ASGI/HTTP connections, not {scope['type']}.")
        executor = self._idle.pop() if self._idle else ThreadPoolExecutor(max_workers=1,
                                                                            thread_name_prefix="django-request")
        if self._view_is_async(scope):
            try:
                async with ThreadSensitiveContext(executor=executor):
                    await self.handle(scope, receive, send)
            finally:
                # Free by now: a view whose request was cancelled (the client went away) may go on in this
                # thread, but Django's handle() always ends with a thread-sensitive call (response.close()
                # or the request_finished receivers) that queues behind it on this one-thread executor.
                self._idle.append(executor)
            return
        try:
            async with ThreadSensitiveContext(executor=executor):
                await self._handle_in_one_hop(scope, receive, send)
        except BaseException:
            # Cancelled (daphne gives up on an app some seconds after its client left) or failed: the
            # thread may still be inside the view. Never lend it again; it ends when the view does.
            executor.shutdown(wait=False)
            raise
        self._idle.append(executor)

    def create_request(self, scope: dict[str, Any], body_file: Any) -> tuple[Any, Any]:
        request, error = super().create_request(scope, body_file)
        if request is not None and self.urlconf is not None:
            request.urlconf = self.urlconf
        return request, error

    def _view_is_async(self, scope: dict[str, Any]) -> bool:
        """Whether the URL's view is a coroutine (Django's async path); unknown URLs take the sync one."""
        path = scope["path"]
        script_name = get_script_prefix(scope).rstrip("/")
        if script_name and path.startswith(script_name):
            path = path[len(script_name):]
        match = _resolved(self.urlconf or settings.ROOT_URLCONF, path or "/")
        return match is not None and iscoroutinefunction(match.func)

    async def _handle_in_one_hop(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        try:
            # The commit's doorbells come back with the thread's result (no wake-up of their own) and leave
            # once the response is written: the person's reply does not wait for the fan-out.
            loop_calls = realtime.LoopCalls(asyncio.get_running_loop())
            response = await realtime.run_collected(loop_calls, _in_request_thread, self._respond, scope, body_file)
            try:
                if response.streaming:
                    loop_calls.run()  # its body may take long (a download, events): the doorbells go first
                await self.send_response(response, send)
            finally:
                loop_calls.run()
                if response.streaming:  # its body was produced while sending: close (request_finished) now
                    await sync_to_async(response.close)()
        finally:
            body_file.close()

    def _respond(self, scope: dict[str, Any], body_file: Any) -> HttpResponseBase:
        """What a WSGI worker does for one request, in the request's thread."""
        set_script_prefix(get_script_prefix(scope))
        signals.request_started.send(sender=self.__class__, scope=scope)
        request, response = self.create_request(scope, body_file)
        if request is not None:
            response = self._sync_chain.get_response(request)
        response._handler_class = self.__class__
        if isinstance(response, FileResponse):
            response.block_size = self.chunk_size  # the ASGI server does the low-level chunking
        if not response.streaming:
            response.close()  # its content is in memory: request_finished here, not one more hop later
        return response


CACHED_PATH_MAX = 256  # longer paths resolve each time: the cache's memory stays bounded (4,096 x 256)


def _resolve(urlconf: str, path: str) -> ResolverMatch | None:
    """A path's match, or None (Django's own resolve then raises its 404, with the patterns it tried)."""
    try:
        return get_resolver(urlconf).resolve(path)
    except Resolver404:
        return None


_resolve_cached = functools.lru_cache(maxsize=4096)(_resolve)


def _resolved(urlconf: str, path: str) -> ResolverMatch | None:
    """``_resolve``, once per path rather than twice per request (the event loop, to choose Django's sync or
    async path, and the request's thread, as Django does): walking the URL patterns was 8% of the loop's time
    and 4% of the thread's under answer POSTs. A match stays true while the process lives; the cache keeps
    the 4,096 paths used last."""
    return (_resolve_cached if len(path) <= CACHED_PATH_MAX else _resolve)(urlconf, path)


class _SyncChain(BaseHandler):
    """Django's handler in sync mode, resolving through ``_resolved``."""

    def resolve_request(self, request: HttpRequest) -> ResolverMatch:
        urlconf = None
        if hasattr(request, "urlconf"):  # as Django's
            urlconf = request.urlconf
            set_urlconf(urlconf)
        cached = _resolved(urlconf or settings.ROOT_URLCONF, request.path_info)
        if cached is None:
            return super().resolve_request(request)
        # The request's own copy (ResolverMatch refuses copy.copy): a view or middleware may change its kwargs.
        match = ResolverMatch.__new__(ResolverMatch)
        match.__dict__.update(cached.__dict__)
        match.kwargs = dict(cached.kwargs)
        request.resolver_match = match
        return match


def _in_request_thread(func: Any) -> Any:
    return sync_to_async(func, thread_sensitive=True)  # the request's kept thread (ThreadSensitiveContext)


def get_asgi_application() -> KeptThreadsASGIHandler:
    """``django.core.asgi.get_asgi_application`` with the handler above."""
    django.setup(set_prefix=False)
    return KeptThreadsASGIHandler()
