"""ai1net settings: everything configurable comes from the environment, here and only here.

The embedded default (no variables set) is SQLite + the in-memory channel layer, one process.
Scaled out: DATABASE_URL=postgres://… and REDIS_URL=redis://… with any number of daphne processes.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from ai1net.cpu_affinity import cpus_from_env

BASE_DIR = Path(__file__).resolve().parent.parent


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def env_list(name: str, default: list[str]) -> list[str]:
    value = os.environ.get(name)
    if not value:
        return default
    return [item.strip() for item in value.split(",") if item.strip()]


DEBUG = env_bool("AI1NET_DEBUG", True)

SECRET_KEY = os.environ.get("AI1NET_SECRET_KEY", "")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured("AI1NET_SECRET_KEY must be set when AI1NET_DEBUG=0.")
    SECRET_KEY = "dev-insecure-ai1net-secret-key-do-not-use-in-production-0123456789"

ALLOWED_HOSTS = env_list("AI1NET_ALLOWED_HOSTS", [] if not DEBUG else ["127.0.0.1", "localhost", "[::1]", "testserver"])
if not DEBUG and not ALLOWED_HOSTS:
    raise ImproperlyConfigured("AI1NET_ALLOWED_HOSTS must be set when AI1NET_DEBUG=0.")

PUBLIC_URL = os.environ.get("AI1NET_PUBLIC_URL", "").rstrip("/")
if not DEBUG and not PUBLIC_URL:
    raise ImproperlyConfigured("AI1NET_PUBLIC_URL must be set when AI1NET_DEBUG=0.")
if PUBLIC_URL:
    CSRF_TRUSTED_ORIGINS = [PUBLIC_URL]

# Operators' emergency stops: when off, they override every user's own switch.
MOBILE_REPLY_ENABLED = env_bool("AI1NET_MOBILE_REPLY", True)
# Phone -> agent messages (mobile.pacing): per session, a daily budget, a quiet period after each
# injection, a rate (released messages per window; the excess waits in order) and a waiting-line cap.
MOBILE_MESSAGE_DAILY_BUDGET = int(os.environ.get("AI1NET_MESSAGE_DAILY_BUDGET", "100"))
MOBILE_MESSAGE_QUIET_SEC = float(os.environ.get("AI1NET_MESSAGE_QUIET_SEC", "5"))
MOBILE_MESSAGE_RATE = int(os.environ.get("AI1NET_MESSAGE_RATE", "10"))
MOBILE_MESSAGE_RATE_WINDOW_SEC = float(os.environ.get("AI1NET_MESSAGE_RATE_WINDOW_SEC", "60"))
MOBILE_MESSAGE_QUEUE_MAX = int(os.environ.get("AI1NET_MESSAGE_QUEUE_MAX", "20"))
DEVICE_WEB_ENABLED = env_bool("AI1NET_DEVICE_WEB", True)
# Device web on a host of its own (ai1net.hosts), e.g. dw.ai1net.example: a device's pages then never
# share the platform's origin. Unset: served on the platform's host (check --deploy warns, ai1net.W001).
DEVICE_WEB_HOST = os.environ.get("AI1NET_DEVICE_WEB_HOST", "").strip().lower().rstrip("/")
if DEVICE_WEB_HOST:
    if "/" in DEVICE_WEB_HOST or "@" in DEVICE_WEB_HOST:
        raise ImproperlyConfigured("AI1NET_DEVICE_WEB_HOST is a host name (dw.ai1net.example), not a URL.")
    _device_web_hostname = urlsplit(f"//{DEVICE_WEB_HOST}").hostname or ""
    if PUBLIC_URL and _device_web_hostname == (urlsplit(PUBLIC_URL).hostname or ""):
        raise ImproperlyConfigured("AI1NET_DEVICE_WEB_HOST must differ from the host of AI1NET_PUBLIC_URL.")
    if "*" not in ALLOWED_HOSTS and _device_web_hostname not in ALLOWED_HOSTS:
        ALLOWED_HOSTS = [*ALLOWED_HOSTS, _device_web_hostname]
# Probes: how long a write/command waits for its approval; whether an agent's API token may approve
# (off: approvals come from a person's session, in Studio or on the phone).
PROBES_APPROVAL_TTL_SEC = int(os.environ.get("AI1NET_PROBES_APPROVAL_TTL_SEC", "900"))
PROBES_TOKEN_APPROVALS = env_bool("AI1NET_PROBES_TOKEN_APPROVALS", False)

# Notifications (notify): Web Push to the phones a user subscribed from /m/, and an ntfy topic. They say
# only "an agent is waiting" and a count. VAPID keys: AI1NET_VAPID_PRIVATE_KEY (raw 32-byte key or DER,
# base64url, or PEM) and AI1NET_VAPID_PUBLIC_KEY (optional: derived, must match when given). Unset while
# debug is on: generated once into VAPID_KEY_FILE (ignored by git). Unset with debug off: Web Push is off
# (ntfy still works); a half-configured key pair is a `check --deploy` warning (notify.W001-W003).
VAPID_PRIVATE_KEY = os.environ.get("AI1NET_VAPID_PRIVATE_KEY", "").strip()
VAPID_PUBLIC_KEY = os.environ.get("AI1NET_VAPID_PUBLIC_KEY", "").strip()
VAPID_SUBJECT = os.environ.get("AI1NET_VAPID_SUBJECT", "").strip() or (
    PUBLIC_URL if PUBLIC_URL.startswith("https://") else "mailto:ai1net@localhost")
VAPID_KEY_FILE = BASE_DIR / ".vapid.json" if DEBUG else None
# Push targets (subscription endpoints, ntfy URLs) must be https on public addresses; with debug on,
# http and loopback/private addresses are allowed too (local push services and ntfy servers).
NOTIFY_ALLOW_PRIVATE_TARGETS = DEBUG
NOTIFY_COALESCE_SEC = float(os.environ.get("AI1NET_NOTIFY_COALESCE_SEC", "5"))  # one push per user per window
NOTIFY_TIMEOUT_SEC = float(os.environ.get("AI1NET_NOTIFY_TIMEOUT_SEC", "5"))  # per request to a push service
NOTIFY_TTL_SEC = int(os.environ.get("AI1NET_NOTIFY_TTL_SEC", "900"))  # how long a push service keeps it

# The CPUs a daphne process keeps its threads on (ai1net.cpu_affinity): one core per process, e.g.
# AI1NET_CPU=0 for one daphne and AI1NET_CPU=1 for another; unset, the kernel places them.
DAPHNE_CPUS = cpus_from_env()

# Device tunnel and pairing (devices app). Tests and the end-to-end runs lower these.
DEVICE_HEARTBEAT_SEC = float(os.environ.get("AI1NET_HEARTBEAT_SEC", "20"))
DEVICE_EPHEMERAL_GRACE_SEC = float(os.environ.get("AI1NET_EPHEMERAL_GRACE_SEC", "30"))
DEVICE_PAIRING_INTERVAL_SEC = int(os.environ.get("AI1NET_PAIRING_INTERVAL_SEC", "5"))
# HTTP long-poll fallback of the tunnel (devices.longpoll): how long a pull is held, how often it
# re-reads the outbox meanwhile; AI1NET_DISABLE_DEVICE_WS=1 refuses /ws/device (tests, broken proxies).
DEVICE_LONGPOLL_HOLD_SEC = float(os.environ.get("AI1NET_LONGPOLL_HOLD_SEC", "25"))
DEVICE_LONGPOLL_TICK_SEC = float(os.environ.get("AI1NET_LONGPOLL_TICK_SEC", "0.5"))
DEVICE_WS_DISABLED = env_bool("AI1NET_DISABLE_DEVICE_WS", False)
# Device web (devices.web): timeouts and caps of requests through a tunnel.
DEVICE_WEB_FIRST_BYTE_SEC = float(os.environ.get("AI1NET_DEVICE_WEB_FIRST_BYTE_SEC", "30"))
DEVICE_WEB_IDLE_SEC = float(os.environ.get("AI1NET_DEVICE_WEB_IDLE_SEC", "300"))
DEVICE_WEB_MAX_REQUEST_BYTES = int(os.environ.get("AI1NET_DEVICE_WEB_MAX_REQUEST_BYTES", str(64 * 1024 * 1024)))
DEVICE_WEB_WS_BUFFER_BYTES = 4 * 1024 * 1024  # browser frames waiting for the device's credit
# Slow and oversized HTTP requests on daphne (ai1net.http_guard): a request's line and headers must arrive
# within this (0: off), a declared body at HTTP_MIN_BODY_RATE bytes/s on average; a larger body than any
# route takes gets 413 unread.
HTTP_HEAD_TIMEOUT_SEC = float(os.environ.get("AI1NET_HTTP_HEAD_TIMEOUT_SEC", "10"))
HTTP_MIN_BODY_RATE = 16 * 1024
# A device-web request served by the process that holds the device's tunnel skips the channel layer
# (devices.web.streams.LocalLink); 0 sends every stream through the layer (tests of that path).
DEVICE_WEB_IN_PROCESS = env_bool("AI1NET_DEVICE_WEB_IN_PROCESS", True)
# Scaled out (the Redis layer), a stream whose device's tunnel another daphne process holds goes straight
# to that process's stream relay (devices.web.relay), not through the layer; 0 sends it through the layer.
# Each process that holds tunnels listens on RELAY_BIND:RELAY_PORT (0: any free port) and other processes
# dial RELAY_HOST (default: the bind address; required when binding every interface, for several hosts).
DEVICE_WEB_RELAY = env_bool("AI1NET_DEVICE_WEB_RELAY", True)
DEVICE_WEB_RELAY_BIND = os.environ.get("AI1NET_DEVICE_WEB_RELAY_BIND", "127.0.0.1").strip()
DEVICE_WEB_RELAY_PORT = int(os.environ.get("AI1NET_DEVICE_WEB_RELAY_PORT", "0"))
DEVICE_WEB_RELAY_HOST = os.environ.get("AI1NET_DEVICE_WEB_RELAY_HOST", "").strip() or DEVICE_WEB_RELAY_BIND
if DEVICE_WEB_RELAY_HOST in ("", "0.0.0.0", "::"):  # noqa: S104 - a check, not a bind
    raise ImproperlyConfigured("AI1NET_DEVICE_WEB_RELAY_BIND binds every interface: set AI1NET_DEVICE_WEB_RELAY_HOST "
                               "to the address other daphne processes reach this one at.")

INSTALLED_APPS = [
    "daphne",
    "ai1net.accounts.admin_config.Ai1netAdminConfig",  # django.contrib.admin, staff need a verified OTP
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "channels",
    "django_otp",
    "django_otp.plugins.otp_totp",
    "django_otp.plugins.otp_static",
    "ai1net.accounts",
    "devices",
    "im",
    "mobile",
    "probes",
    "notify",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "ai1net.hosts.device_web_host_middleware",  # device web's own host: only /d/ and the login there
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "ai1net.accounts.sessions.AuthenticationMiddleware",  # Django's, taking the user read with the session
    "django_otp.middleware.OTPMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "ai1net.exceptions.DatabaseErrorMiddleware",  # a dropped database connection: 503 + error body
]

ROOT_URLCONF = "ai1net.urls"
ASGI_APPLICATION = "ai1net.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- database -------------------------------------------------------------------------------
DATABASE_URL = os.environ.get("DATABASE_URL", f"sqlite:///{BASE_DIR / 'db.sqlite3'}")
DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=0)}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    DATABASES["default"]["ENGINE"] = "ai1net.sqlite_backend"  # Django's, placeholders converted once per statement
    # daphne runs ORM calls in worker threads: let writers queue instead of failing "locked".
    DATABASES["default"]["OPTIONS"] = {
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        "transaction_mode": "IMMEDIATE",
        "timeout": 30,
    }
    # Keep each worker thread's connection: closing the last one checkpoints the WAL with fsyncs,
    # which made every tunnel write cost 20-30 ms (bench/tunnel.py).
    DATABASES["default"]["CONN_MAX_AGE"] = None
    # A file, not :memory:, so the real processes that end-to-end tests start can share it;
    # one per test run (pid), so runs side by side never share a database.
    DATABASES["default"]["TEST"] = {
        "NAME": os.environ.get("AI1NET_TEST_SQLITE", str(BASE_DIR / f".test-db-{os.getpid()}.sqlite3"))
    }
else:
    DATABASES["default"]["TEST"] = {"NAME": f"test_{DATABASES['default']['NAME']}_{os.getpid()}"}
    if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql" and env_bool("AI1NET_DB_POOL", True):
        # Under ASGI a new connection per ORM call cost 12-20 ms (a backend fork each): pool them.
        DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {"min_size": 2, "max_size": 10, "timeout": 10}
    if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql" and env_bool("AI1NET_DB_PREPARE", True):
        # Parameters bound on the server and statements prepared per connection after a few runs:
        # client-side binding quoted every parameter into the text in Python (10% of daphne's CPU in a
        # connect storm) and PostgreSQL parsed and planned every statement anew. Our own connections
        # (the pool above), no pgbouncer in between, so prepared statements stay where they were made.
        DATABASES["default"].setdefault("OPTIONS", {}).update({"server_side_binding": True, "prepare_threshold": 5})
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- channel layer and cache -----------------------------------------------------------------
REDIS_URL = os.environ.get("REDIS_URL", "")
# Test runs side by side (pytest-xdist workers) each keep their own keys and groups, as they keep
# their own database: their user and device ids overlap.
_TEST_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
REDIS_PREFIX = os.environ.get("AI1NET_REDIS_PREFIX") or (f"ai1net-{_TEST_WORKER}" if _TEST_WORKER else "ai1net")
if REDIS_URL:
    # The layer is a doorbell, never a queue (shared/reference/stack-notes.md). redis-py 8 would
    # otherwise time idle consumers out after ~5 s and cap the pool at 100 connections.
    # No CLIENT SETINFO on a new connection (driver_info None): Redis before 7.2 (Debian 12's 7.0) refuses
    # it, so each new connection sent two commands for two errors that redis-py caught and left in
    # reference cycles (tests/test_connection_cycles.py); and redis-py 8 looked its own version up in the
    # installed packages' metadata for every new connection (6% of daphne's CPU in a connect storm).
    # Nor CLIENT MAINT_NOTIFICATIONS (a managed service's failover notices): Redis 7.0 refuses that too.
    from redis.maint_notifications import MaintNotificationsConfig

    _REDIS_CONNECTION = {"driver_info": None, "maint_notifications_config": MaintNotificationsConfig(enabled=False)}
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "ai1net.channel_layers.RedisChannelLayer",  # channels-redis in fewer round trips
            "CONFIG": {
                "hosts": [{"address": REDIS_URL, "socket_timeout": None, "max_connections": 100_000,
                           **_REDIS_CONNECTION}],
                "prefix": f"{REDIS_PREFIX}:asgi",
                "capacity": 1000,
                "expiry": 30,
            },
        }
    }
    CACHES = {
        "default": {
            "BACKEND": "ai1net.cache.SharedRedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": f"{REDIS_PREFIX}:cache",
            "OPTIONS": _REDIS_CONNECTION,
        }
    }
else:
    # Channels' in-memory layer, without its O(sockets) sweep on every message (ai1net.channel_layers).
    CHANNEL_LAYERS = {"default": {"BACKEND": "ai1net.channel_layers.InMemoryChannelLayer"}}
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

# --- auth ------------------------------------------------------------------------------------
AUTH_USER_MODEL = "accounts.User"
LOGIN_URL = "accounts:login"
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "accounts:login"
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
OTP_TOTP_ISSUER = "ai1net"

# --- security --------------------------------------------------------------------------------
SESSION_ENGINE = "ai1net.accounts.sessions"  # Django's database sessions, read with one written statement
SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = False  # the phone page's JS reads it to send X-CSRFToken
SESSION_COOKIE_SECURE = not DEBUG
CSRF_COOKIE_SECURE = not DEBUG
SESSION_COOKIE_SAMESITE = "Lax"
# The login's mark of a browser that logged in before (ai1net.accounts.views, rate limits).
KNOWN_BROWSER_COOKIE_NAME = "ai1net_known_browser"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
if not DEBUG:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = env_bool("AI1NET_SSL_REDIRECT", True)
    SECURE_HSTS_SECONDS = 31_536_000
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    # Joining the browsers' preload list is an operator's decision, not a default.
    SECURE_HSTS_PRELOAD = env_bool("AI1NET_HSTS_PRELOAD", False)
    if not SECURE_HSTS_PRELOAD:
        SILENCED_SYSTEM_CHECKS = ["security.W021"]

# --- i18n / static ---------------------------------------------------------------------------
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = BASE_DIR / ".staticfiles"
# The single-file clients (.pyz) served at /downloads/<name>; `make pyz` builds them here.
DOWNLOADS_DIR = Path(os.environ.get("AI1NET_DOWNLOADS_DIR", BASE_DIR / "static" / "downloads"))

# --- API -------------------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "ai1net.accounts.authentication.SessionAuthentication",  # DRF's, handing views the user itself
        "ai1net.accounts.authentication.ApiTokenAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "EXCEPTION_HANDLER": "ai1net.exceptions.api_exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "ai1net API",
    "DESCRIPTION": "Mobile reply, probes and device web.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # Operation ids and tags come from the path after /api/ whatever else gets routed.
    "SCHEMA_PATH_PREFIX": r"/api/",
    "PREPROCESSING_HOOKS": ["ai1net.schema.add_longpoll_endpoints"],
    "ENUM_NAME_OVERRIDES": {
        "DeviceKindEnum": "devices.models.Device.Kind",
        "DeviceStatusEnum": "devices.models.Device.Status",
    },
    "APPEND_COMPONENTS": {"securitySchemes": {
        "deviceToken": {"type": "http", "scheme": "bearer",
                        "description": "The device token from POST /api/devices/pairings/token."},
    }},
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": os.environ.get("AI1NET_LOG_LEVEL", "WARNING")},
}
