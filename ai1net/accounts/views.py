"""Pages: login with a two-factor step, the account page (switch, two-factor, API tokens), first run."""

from __future__ import annotations

import secrets
import time
from urllib.parse import urlencode

import qrcode
import qrcode.image.svg
from django.conf import settings
from django.contrib import messages
from django.contrib.auth import authenticate, update_session_auth_hash
from django.contrib.auth import login as auth_login
from django.contrib.auth.decorators import login_required
from django.core import signing
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.template import TemplateDoesNotExist
from django.template.loader import get_template
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.safestring import mark_safe
from django.views.decorators.http import require_http_methods, require_POST
from django_otp import login as otp_login

from ai1net import hosts
from ai1net.accounts import ratelimit, selectors, services
from ai1net.accounts.forms import ApiTokenForm, FirstOperatorForm, LoginForm, OtpForm
from ai1net.accounts.models import BackupCodeDevice, User
from ai1net.exceptions import ApplicationError, retry_after_header

PENDING_KEY = "accounts.pending_otp"
PENDING_TTL = 5 * 60
HOME_CARD_APPS = ("mobile", "devices", "probes", "im")
KNOWN_BROWSER_COOKIE = settings.KNOWN_BROWSER_COOKIE_NAME
KNOWN_BROWSER_SALT = "ai1net.accounts.known-browser"
KNOWN_BROWSER_MAX_AGE = 180 * 24 * 3600


def client_ip(request: HttpRequest) -> str:
    # REMOTE_ADDR only: a forwarded header is whatever the client wants it to be.
    return request.META.get("REMOTE_ADDR", "") or ""


def rate_limited_page(request: HttpRequest, exc: ApplicationError) -> HttpResponse:
    """A browser's 429: the page names the wait, ``Retry-After`` gives it in seconds."""
    return with_retry_after(render(request, "rate_limited.html", {"detail": exc.detail}, status=exc.status), exc)


def with_retry_after(response: HttpResponse, exc: ApplicationError | None) -> HttpResponse:
    for name, value in (retry_after_header(exc) if exc is not None else {}).items():
        response[name] = value
    return response


def mark_known_browser(response: HttpResponse, user: User) -> HttpResponse:
    """After a complete login: a signed mark that this browser knows this account (see ``login_view``)."""
    mark = signing.dumps({"u": str(user.pk), "n": secrets.token_urlsafe(16)}, salt=KNOWN_BROWSER_SALT)
    response.set_cookie(KNOWN_BROWSER_COOKIE, mark, max_age=KNOWN_BROWSER_MAX_AGE, httponly=True,
                        secure=settings.SESSION_COOKIE_SECURE, samesite="Lax")
    return response


def known_browser(request: HttpRequest, username: str) -> str:
    """The id of this browser's mark when it last logged in as ``username``; ``""`` otherwise."""
    try:
        mark = signing.loads(request.COOKIES.get(KNOWN_BROWSER_COOKIE, ""), salt=KNOWN_BROWSER_SALT,
                             max_age=KNOWN_BROWSER_MAX_AGE)
    except signing.BadSignature:
        return ""
    if not isinstance(mark, dict) or not mark.get("n"):
        return ""
    same = User.objects.filter(pk=mark.get("u"), **{User.USERNAME_FIELD: username}).exists()
    return str(mark["n"]) if same else ""


def _next_url(request: HttpRequest) -> str:
    candidate = request.POST.get("next") or request.GET.get("next") or ""
    if candidate and url_has_allowed_host_and_scheme(candidate, {request.get_host()}, request.is_secure()):
        return candidate
    if hosts.is_device_web_host(request.get_host()):  # that host serves no home page: the platform's
        return hosts.platform_home()
    return reverse("home")


def _is_verified(request: HttpRequest) -> bool:
    check = getattr(request.user, "is_verified", None)
    return bool(check and check())


# --- login -------------------------------------------------------------------------------------


@require_http_methods(["GET", "POST"])
def login_view(request: HttpRequest) -> HttpResponse:
    next_url = _next_url(request)
    form = LoginForm(request.POST or None)
    status = 200
    refused = None
    if request.method == "POST" and form.is_valid():
        username = form.cleaned_data["username"]
        # A browser this account logged in from before has its own counter instead of the account's, so
        # someone guessing the password elsewhere cannot lock the owner out of their own browser.
        browser = known_browser(request, username)
        account = (ratelimit.LOGIN_PER_KNOWN_BROWSER, browser) if browser else (ratelimit.LOGIN_PER_ACCOUNT, username)
        limits = (account, (ratelimit.LOGIN_PER_ADDRESS, client_ip(request)))
        if refused := ratelimit.refusal(*limits):
            form.add_error(None, refused.detail)
            status = 429
        else:
            user = authenticate(request, username=username, password=form.cleaned_data["password"])
            if user is None:
                ratelimit.fail(*limits, ip=client_ip(request))
                form.add_error(None, "Wrong username or password.")
            elif selectors.user_needs_otp(user):
                request.session[PENDING_KEY] = {"user": user.pk, "backend": user.backend, "at": time.time()}
                return redirect(f"{reverse('accounts:login_otp')}?{urlencode({'next': next_url})}")
            else:
                auth_login(request, user)
                ratelimit.reset((ratelimit.LOGIN_PER_ACCOUNT, username), account)
                return mark_known_browser(redirect(next_url), user)
    return with_retry_after(
        render(request, "accounts/login.html", {"form": form, "next": next_url}, status=status), refused)


def _otp_target(request: HttpRequest) -> tuple[User | None, str | None]:
    """Who is being verified: a password-checked login in progress, or a logged-in unverified user."""
    if request.user.is_authenticated:
        return request.user, None
    pending = request.session.get(PENDING_KEY)
    if not pending or time.time() - float(pending.get("at", 0)) > PENDING_TTL:
        return None, None
    user = User.objects.filter(pk=pending.get("user"), is_active=True).first()
    return user, pending.get("backend")


@require_http_methods(["GET", "POST"])
def login_otp_view(request: HttpRequest) -> HttpResponse:
    next_url = _next_url(request)
    user, backend = _otp_target(request)
    if user is None:
        request.session.pop(PENDING_KEY, None)
        messages.info(request, "Log in again: that sign-in took too long.")
        return redirect(f"{reverse('accounts:login')}?{urlencode({'next': next_url})}")
    if request.user.is_authenticated and (_is_verified(request) or not selectors.user_needs_otp(user)):
        return redirect(next_url)
    form = OtpForm(request.POST or None)
    status = 200
    refused = None
    if request.method == "POST" and form.is_valid():
        limits = ((ratelimit.OTP_PER_ACCOUNT, str(user.pk)), (ratelimit.OTP_PER_ADDRESS, client_ip(request)))
        if refused := ratelimit.refusal(*limits):
            form.add_error(None, refused.detail)
            status = 429
        else:
            device = services.otp_verify(user=user, token=form.cleaned_data["code"])
            if device is None:
                ratelimit.fail(*limits, ip=client_ip(request), actor=user)
                form.add_error("code", "That code is not right, has expired, or was already used.")
            else:
                if not request.user.is_authenticated:
                    auth_login(request, user, backend=backend)
                otp_login(request, device)
                request.session.pop(PENDING_KEY, None)
                ratelimit.reset((ratelimit.OTP_PER_ACCOUNT, str(user.pk)),
                                (ratelimit.LOGIN_PER_ACCOUNT, user.get_username()))
                if isinstance(device, BackupCodeDevice):
                    messages.warning(request, f"Backup code used. {device.remaining()} left.")
                return mark_known_browser(redirect(next_url), user)
    return with_retry_after(
        render(request, "accounts/login_otp.html", {"form": form, "next": next_url}, status=status), refused)


# --- home --------------------------------------------------------------------------------------


def _home_cards() -> list[str]:
    """Apps add a status card to the home page by shipping ``templates/<app>/home_card.html``."""
    cards = []
    for app in HOME_CARD_APPS:
        name = f"{app}/home_card.html"
        try:
            get_template(name)
        except TemplateDoesNotExist:
            continue
        cards.append(name)
    return cards


@login_required
def home(request: HttpRequest) -> HttpResponse:
    return render(request, "home.html", {
        "cards": _home_cards(),
        "mobile_reply_active": selectors.mobile_reply_active(request.user),
        "device_web_active": selectors.device_web_active(request.user),
        "global_stops": selectors.global_stops(),
    })


# --- account page ------------------------------------------------------------------------------


def _qr_svg(data: str) -> str:
    image = qrcode.make(data, image_factory=qrcode.image.svg.SvgPathImage, box_size=10, border=2)
    return image.to_string(encoding="unicode")


def _account_context(request: HttpRequest, **extra: object) -> dict:
    user = request.user
    pending = selectors.totp_pending(user)
    context = {
        "verified": _is_verified(request),
        "totp": selectors.totp_confirmed(user),
        "pending": pending,
        "backup_remaining": selectors.backup_codes_remaining(user),
        "tokens": user.api_tokens.filter(revoked_at__isnull=True).order_by("-created_at"),
        "token_form": ApiTokenForm(),
        "otp_form": OtpForm(),
        "mobile_reply_active": selectors.mobile_reply_active(user),
        "device_web_active": selectors.device_web_active(user),
        "global_stops": selectors.global_stops(),
        "mobile_reply_stopped": not settings.MOBILE_REPLY_ENABLED,
    }
    if pending is not None:
        # Generated here from our own otpauth URI by qrcode: safe to inline.
        context["qr_svg"] = mark_safe(_qr_svg(pending.config_url))  # noqa: S308
        context["otpauth_uri"] = pending.config_url
        context["secret_text"] = services.totp_secret_text(pending)
    context.update(extra)
    return context


@login_required
@require_http_methods(["GET"])
def account(request: HttpRequest) -> HttpResponse:
    return render(request, "accounts/account.html", _account_context(request))


def _fail(request: HttpRequest, exc: ApplicationError) -> HttpResponse:
    messages.error(request, exc.detail)
    return render(request, "accounts/account.html", _account_context(request), status=exc.status)


@login_required
@require_POST
def mobile_reply_set(request: HttpRequest) -> HttpResponse:
    enabled = request.POST.get("enabled") == "1"
    changed = services.user_switch_set(actor=request.user, user=request.user, switch="mobile_reply", enabled=enabled,
                                       ip=client_ip(request))
    if changed:
        messages.success(request, f"Mobile reply turned {'on' if enabled else 'off'}.")
    return redirect("accounts:account")


@login_required
@require_POST
def otp_start(request: HttpRequest) -> HttpResponse:
    try:
        services.totp_enrolment_start(user=request.user)
    except ApplicationError as exc:
        return _fail(request, exc)
    return redirect(f"{reverse('accounts:account')}#two-factor")


@login_required
@require_POST
def otp_confirm(request: HttpRequest) -> HttpResponse:
    try:
        device, codes = services.totp_enrolment_confirm(user=request.user, token=request.POST.get("code", ""),
                                                        ip=client_ip(request))
    except ApplicationError as exc:
        return _fail(request, exc)
    update_session_auth_hash(request, request.user)  # other sessions end; this one stays
    otp_login(request, device)  # the code just proved possession: this session is verified
    messages.success(request, "Two-factor is on. Keep the backup codes somewhere safe: they are shown once.")
    return render(request, "accounts/account.html", _account_context(request, new_backup_codes=codes))


def _require_verified(request: HttpRequest) -> HttpResponse | None:
    if _is_verified(request):
        return None
    messages.error(request, "Confirm your two-factor code first.")
    return redirect(f"{reverse('accounts:login_otp')}?{urlencode({'next': reverse('accounts:account')})}")


@login_required
@require_POST
def otp_remove(request: HttpRequest) -> HttpResponse:
    if (refusal := _require_verified(request)) is not None:
        return refusal
    services.otp_remove(user=request.user, ip=client_ip(request))
    update_session_auth_hash(request, request.user)
    messages.success(request, "Two-factor removed.")
    return redirect("accounts:account")


@login_required
@require_POST
def backup_codes_regenerate(request: HttpRequest) -> HttpResponse:
    if (refusal := _require_verified(request)) is not None:
        return refusal
    try:
        codes = services.backup_codes_generate(user=request.user, ip=client_ip(request))
    except ApplicationError as exc:
        return _fail(request, exc)
    messages.success(request, "New backup codes. The old ones no longer work.")
    return render(request, "accounts/account.html", _account_context(request, new_backup_codes=codes))


@login_required
@require_POST
def api_token_create(request: HttpRequest) -> HttpResponse:
    if not _is_verified(request):
        messages.error(request, "API tokens need a login verified with two-factor. Set it up first.")
        return render(request, "accounts/account.html", _account_context(request), status=403)
    form = ApiTokenForm(request.POST)
    if not form.is_valid():
        return render(request, "accounts/account.html", _account_context(request, token_form=form), status=400)
    token, raw = services.api_token_create(user=request.user, name=form.cleaned_data["name"], ip=client_ip(request))
    return render(request, "accounts/account.html", _account_context(request, new_token=raw, new_token_obj=token))


@login_required
@require_POST
def api_token_revoke(request: HttpRequest, token_id: int) -> HttpResponse:
    try:
        services.api_token_revoke(user=request.user, token_id=token_id, ip=client_ip(request))
    except ApplicationError as exc:
        raise Http404(exc.detail) from exc
    messages.success(request, "Token revoked.")
    return redirect("accounts:account")


# --- first run ---------------------------------------------------------------------------------


@require_http_methods(["GET", "POST"])
def first_run(request: HttpRequest, token: str) -> HttpResponse:
    # No account exists yet: only the address is counted. A wrong link counts; a used or expired one too.
    limits = ((ratelimit.SETUP_LINK_PER_ADDRESS, client_ip(request)),)
    if refused := ratelimit.refusal(*limits, what="Too many wrong set-up links from this address."):
        return rate_limited_page(request, refused)
    if not services.first_run_token_valid(raw=token):
        ratelimit.fail(*limits, ip=client_ip(request))
        raise Http404("This set-up link is used or expired.")
    form = FirstOperatorForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            user = services.first_run_complete(raw=token, username=form.cleaned_data["username"],
                                               email=form.cleaned_data["email"],
                                               password=form.cleaned_data["password1"], ip=client_ip(request))
        except ApplicationError as exc:
            raise Http404(exc.detail) from exc
        auth_login(request, user, backend="django.contrib.auth.backends.ModelBackend")
        messages.success(request, "Operator account created. Now set up two-factor: the admin needs it.")
        return redirect("accounts:account")
    return render(request, "accounts/first_run.html", {"form": form})
