from __future__ import annotations

from django.contrib.staticfiles import finders
from django.http import Http404, HttpRequest, HttpResponse
from django.views.decorators.http import require_GET

SERVICE_WORKER = "notify/sw.js"


@require_GET
def service_worker(request: HttpRequest) -> HttpResponse:
    """The service worker from static/, served at /m/sw.js so that its scope is /m/ (a worker's scope is
    at most its own directory). It holds nothing of the user's, so it needs no login."""
    path = finders.find(SERVICE_WORKER)
    if not path:
        raise Http404()
    with open(path, "rb") as handle:
        body = handle.read()
    response = HttpResponse(body, content_type="text/javascript; charset=utf-8")
    response["Cache-Control"] = "no-cache"
    response["Service-Worker-Allowed"] = "/m/"
    return response
