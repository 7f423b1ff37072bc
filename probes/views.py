from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.csrf import ensure_csrf_cookie

from im.access import http_otp_satisfied
from probes import selectors
from probes.models import APPROVAL_OPS, READ_OPS

STUDIO_OP_ORDER = ("read", "read_tree", "grep", "stat", "ast_parse", "git_diff", "git_log", "ping", "info",
                   "write", "run", "run_background", "run_output", "stop")


@login_required
@ensure_csrf_cookie  # studio.js sends X-CSRFToken with its POSTs
def studio(request: HttpRequest) -> HttpResponse:
    if not http_otp_satisfied(request):
        return redirect_to_login(request.get_full_path())
    probes = [selectors.probe_describe(d) for d in selectors.probes_for_user(user=request.user)]
    ops = [op for op in STUDIO_OP_ORDER if op in READ_OPS | APPROVAL_OPS]
    context = {"probes": probes, "selected": request.GET.get("probe", ""), "ops": ops}
    return render(request, "probes/studio.html", context)
