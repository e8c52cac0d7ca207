"""Settings for the Archipelago web app: one file, every knob read from the environment.

Two profiles: development (the default: a dev secret key, plain cookies) and
production (ARCHIPELAGO_PROFILE=production: the secret key must be given, cookies
are secure, HSTS and the HTTPS redirect are on) so that `check --deploy` is clean.
"""

from __future__ import annotations

import importlib.util
import os
import sysconfig
from datetime import timedelta
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from syncd.environment import data_dir, flag, items, number, path, text, whole
from webapp.processes import physical_memory_mb, redis_maxmemory_mb

BASE_DIR = Path(__file__).resolve().parent.parent


def read_secret_key(debug: bool, production: bool) -> str:
    if key := text("SECRET_KEY"):
        return key
    if key_file := text("SECRET_KEY_FILE"):
        try:
            key = Path(key_file).read_text().strip()
        except OSError as e:
            raise ImproperlyConfigured(f"SECRET_KEY_FILE {key_file!r} cannot be read: {e}"
                                       ) from e
        if not key:
            raise ImproperlyConfigured(f"SECRET_KEY_FILE {key_file!r} is empty.")
        return key
    if debug or not production:
        return "django-insecure-archipelago-development-key-never-use-in-production"
    raise ImproperlyConfigured(
        "In the production profile set SECRET_KEY, or SECRET_KEY_FILE naming a file that "
        "holds it (50 or more random characters).")


PROFILE = text("ARCHIPELAGO_PROFILE", "development")
if PROFILE not in ("development", "production"):
    raise ImproperlyConfigured(
        f"ARCHIPELAGO_PROFILE must be development or production, got {PROFILE!r}.")
PRODUCTION = PROFILE == "production"
DEBUG = flag("DEBUG")
SECRET_KEY = read_secret_key(DEBUG, PRODUCTION)
ALLOWED_HOSTS = items("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]")
CSRF_TRUSTED_ORIGINS = items("CSRF_TRUSTED_ORIGINS", "")
# API clients get their CSRF failures in JSON.
CSRF_FAILURE_VIEW = "webapp.api.views.csrf_failure"

VAR_DIR = BASE_DIR / "var"
VAR_DIR.mkdir(parents=True, exist_ok=True)

INSTALLED_APPS = [
    # First, so that runserver serves the ASGI application (HTTP and websockets).
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    # Serves the API docs' Swagger UI from the package, not from a CDN.
    "ninja",
    "webapp.runs",
    "webapp.api",
    "webapp.dashboard",
    # Counts failed sign-ins (webapp/dashboard/login.py).
    "axes",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "webapp.urls"
ASGI_APPLICATION = "webapp.asgi.application"

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

DATABASES = {
    "default": dj_database_url.parse(
        text("DATABASE_URL", f"sqlite:///{VAR_DIR / 'db.sqlite3'}")),
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # WAL lets the web app read while syncd writes; IMMEDIATE takes the write lock at
    # BEGIN, so two writers wait for each other (up to the timeout) instead of failing
    # with "database is locked" halfway through a transaction.
    DATABASES["default"]["OPTIONS"] = {
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        "timeout": 20,
        "transaction_mode": "IMMEDIATE",
    }
    # The test database is a file beside the real one, so that the processes the
    # runtime tests start (syncd, workers) open the same database as the tests.
    db_path = Path(DATABASES["default"]["NAME"])
    DATABASES["default"]["TEST"] = {"NAME": str(db_path.with_name(f"test_{db_path.name}"))}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "dashboard:runs"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
# plotly.js from the plotly package itself (static/plotly/plotly.min.js): the charts
# render offline, with no CDN.
STATICFILES_DIRS = [("plotly", Path(importlib.util.find_spec("plotly").origin).parent
                     / "package_data")]

# Archipelago itself.
REDIS_URL = text("REDIS_URL", "redis://127.0.0.1:6379/0")
# The data plane: a Redis that keeps nothing on disk, where update messages in flight
# (and, with SYNCD_SERVE off, published fragments) lie (syncd/run_keys.py); empty,
# they share REDIS_URL's
# (webapp.runs.stores.dataplane_url).
DATAPLANE_REDIS_URL = text("DATAPLANE_REDIS_URL")
REGIONS = items("REGIONS", "us-east,us-central,us-west,us-south")
# The region syncd runs in: the run page's map draws each island's link to it.
SYNCD_REGION = text("SYNCD_REGION", REGIONS[0] if REGIONS else "us-east")
CHECKPOINT_DIR = path("CHECKPOINT_DIR", VAR_DIR / "checkpoints")
# Seconds a run's lease outlives the last renewal by the syncd serving it: when a
# syncd dies, another takes its runs over after this long (syncd/lease.py).
SYNCD_LEASE_TTL_S = whole("SYNCD_LEASE_TTL_S", 10, minimum=1)
# Threads of syncd's tensor work (torch.set_num_threads). One by default: syncd shares
# its host with islands, and torch's threads spin-waiting on oversubscribed cores make a
# check of one update a hundred times slower. Raise it on a host of syncd's own.
SYNCD_THREADS = whole("SYNCD_THREADS", 1, minimum=1)
# The share of syncd's host's CPU that each run's live evaluation takes on average
# (syncd/evaluation.py): the next evaluation waits until the last one's CPU time fits.
SYNCD_EVAL_CPU_SHARE = number("SYNCD_EVAL_CPU_SHARE", 0.02)
if not 0 < SYNCD_EVAL_CPU_SHARE <= 1:
    raise ImproperlyConfigured(
        f"SYNCD_EVAL_CPU_SHARE must be above 0 and at most 1, got {SYNCD_EVAL_CPU_SHARE}.")
# Where syncd serves published fragments to islands from its files, host:port (0: any
# free port), or off to put them on the data plane (syncd/published_server.py). Loopback
# by default; islands on other hosts need an interface they reach and SYNCD_SERVE_URL,
# how they reach it (http://host:port). With a certificate and its key (PEM files) the
# server speaks HTTPS (SYNCD_SERVE_URL https://host:port); islands check it against
# their host's trusted authorities, or those of the file SSL_CERT_FILE names.
SYNCD_SERVE = text("SYNCD_SERVE", "127.0.0.1:0")
SYNCD_SERVE_CERT = text("SYNCD_SERVE_CERT") or None
SYNCD_SERVE_KEY = text("SYNCD_SERVE_KEY") or None
if bool(SYNCD_SERVE_CERT) != bool(SYNCD_SERVE_KEY):
    raise ImproperlyConfigured("SYNCD_SERVE_CERT and SYNCD_SERVE_KEY go together: set both "
                               "for HTTPS, or neither.")
SYNCD_SERVE_URL = text("SYNCD_SERVE_URL") or None
_SERVE_SCHEME = "https://" if SYNCD_SERVE_CERT else "http://"
if SYNCD_SERVE_URL and not SYNCD_SERVE_URL.startswith(_SERVE_SCHEME):
    raise ImproperlyConfigured(
        f"SYNCD_SERVE_URL must start with {_SERVE_SCHEME}"
        f"{' (SYNCD_SERVE_CERT is set)' if SYNCD_SERVE_CERT else ''}, got {SYNCD_SERVE_URL!r}.")
# Island logs (run-<id>/<island>.log) and, under `python -m webapp.start`, one log
# per process.
LOG_DIR = path("LOG_DIR", VAR_DIR / "logs")
# Where `python -m bench` writes its results and HTML reports; the dashboard serves the
# reports from here.
BENCH_RESULTS_DIR = path("BENCH_RESULTS_DIR", BASE_DIR / "bench" / "results")
# Warm standby islands each island host keeps ready (trainer/pool_manager.py): "auto"
# (None here) keeps as many as the largest active run has islands in the host's region
# that the host does not run yet, plus one (a spare), within the host's memory; a
# number keeps that many; 0 turns the pool off, and every start and rejoin is cold.
_pool_size = text("ISLAND_POOL_SIZE", "auto").lower()
if _pool_size != "auto" and not _pool_size.isdigit():
    raise ImproperlyConfigured(
        f"ISLAND_POOL_SIZE must be auto or a whole number of 0 or more, got {_pool_size!r}.")
ISLAND_POOL_SIZE: int | None = None if _pool_size == "auto" else int(_pool_size)
# How long a start waits for its regions' pools to have a standby ready for each of its
# islands (webapp/runs/lifecycle.py); the islands without one start cold, said in an
# event.
ISLAND_POOL_FILL_WAIT_S = number("ISLAND_POOL_FILL_WAIT_S", 30.0)
if ISLAND_POOL_FILL_WAIT_S < 0:
    raise ImproperlyConfigured(
        f"ISLAND_POOL_FILL_WAIT_S must be 0 or more, got {ISLAND_POOL_FILL_WAIT_S}.")
# The bearer token a Prometheus scraper sends to /metrics; empty: only signed-in
# operators (and staff) may read it.
METRICS_TOKEN = text("METRICS_TOKEN")
# The data directory: users' corpora may live here, and every corpus is prepared once
# into byte files under its prepared/ folder (island processes, which do not load Django,
# read it through syncd.environment.data_dir too).
DATA_DIR = data_dir()
# The folders a run's data.path may name a file or folder in, separated by the
# platform's path separator (":"). A path that resolves (symlinks and ".." followed)
# outside every one is refused (webapp.runs.validation.check_data_path). Default: DATA_DIR
# and the Python standard library's folder, which the default corpus reads.
DATA_ROOTS = [Path(p) for p in items(
    "DATA_ROOTS", os.pathsep.join([str(DATA_DIR), sysconfig.get_paths()["stdlib"]]), os.pathsep)]

# The memory the hosts declare. A run whose estimate (diloco/sizes.py), added to what
# the other admitted runs take, does not fit is refused when it is made, when it is
# started and when an island is added to it (webapp.runs.validation): Redis's against
# REDIS_MAXMEMORY_MB, which `python -m webapp.start` gives its embedded Redis as
# maxmemory (default a quarter of this machine's memory); syncd's against
# SYNCD_HOST_MEMORY_MB, the memory of syncd's host (default this machine's); each
# region's islands against ISLAND_HOST_MEMORY_MB, the memory of the host that runs a
# region's islands (default this machine's).
REDIS_MAXMEMORY_MB = redis_maxmemory_mb()
SYNCD_HOST_MEMORY_MB = whole("SYNCD_HOST_MEMORY_MB", physical_memory_mb())
ISLAND_HOST_MEMORY_MB = whole("ISLAND_HOST_MEMORY_MB", physical_memory_mb())
if min(REDIS_MAXMEMORY_MB, SYNCD_HOST_MEMORY_MB, ISLAND_HOST_MEMORY_MB) < 1:
    raise ImproperlyConfigured(
        f"REDIS_MAXMEMORY_MB, SYNCD_HOST_MEMORY_MB and ISLAND_HOST_MEMORY_MB must be at "
        f"least 1, got {REDIS_MAXMEMORY_MB}, {SYNCD_HOST_MEMORY_MB} and "
        f"{ISLAND_HOST_MEMORY_MB}.")

# Form posts: the new-run form has about 50 fields and 7 per island row, up to
# diloco.config.MAX_ISLANDS (256) rows; Django's default of 1000 fields would refuse
# the larger ones. Bodies stay under Django's default of 2.5 MB (the API's own limit is
# 1 MiB, webapp/api/api.py).
DATA_UPLOAD_MAX_NUMBER_FIELDS = 2000

# Sign-in (webapp/dashboard/login.py, django-axes): after this many failed sign-ins of one
# username from one address, the sign-in forms refuse attempts until this long has
# passed since the last failure. axes keeps the counts in the database.
AXES_FAILURE_LIMIT = whole("LOGIN_FAILURE_LIMIT", 5)
AXES_COOLOFF_TIME = timedelta(seconds=whole("LOGIN_FAILURE_WINDOW_S", 300))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_USERNAME_CALLABLE = "webapp.dashboard.login.axes_username"
AXES_RESET_ON_SUCCESS = True
# Only failures are kept, not a row per successful sign-in.
AXES_DISABLE_ACCESS_LOG = True
# Behind reverse proxies every request comes from a proxy's address, so one user's
# failures would lock that user out for everybody. TRUSTED_PROXY_COUNT says how many
# proxies stand in front of the web app (each appends to X-Forwarded-For); the address
# is then read from that header by django-ipware, strictly: a header with more entries
# than the proxies add (a client's own, spoofed) counts as the proxy's address.
TRUSTED_PROXY_COUNT = whole("TRUSTED_PROXY_COUNT", 0)
if TRUSTED_PROXY_COUNT > 0:
    AXES_IPWARE_META_PRECEDENCE_ORDER = ("HTTP_X_FORWARDED_FOR", "REMOTE_ADDR")
    AXES_IPWARE_PROXY_COUNT = TRUSTED_PROXY_COUNT - 1  # entries after the client's
    IPWARE_STRICT = True
else:
    AXES_IPWARE_META_PRECEDENCE_ORDER = ("REMOTE_ADDR",)
# axes' backend refuses a locked-out sign-in whatever form sent it; ModelBackend signs in.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
# axes' middleware only swaps the answer to a locked-out sign-in for a page of its own;
# the forms answer it themselves, so it is left out, and its check (W002) with it.
SILENCED_SYSTEM_CHECKS = ["axes.W002"]

CELERY_BROKER_URL = REDIS_URL
# An island is one long task. It is acknowledged when it ends, so a worker shut
# down mid-run puts its islands back on their queue (the next start finds them; an
# island whose epoch was moved on since does not start, see trainer.supervisor); and
# each worker process takes one task at a time, so no island waits behind another in
# a prefetch buffer.
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# Redis hands an unacknowledged task to another worker after this many seconds; it
# must outlast the longest island task, or one island would run twice.
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": whole("CELERY_VISIBILITY_TIMEOUT", 7 * 24 * 3600),
}
# A worker process that dies mid-task (SIGKILL, out of memory, its host gone) loses
# that island: the task is acknowledged as failed, not handed to another worker. On
# purpose: a redelivered island would come back with the same epoch beside a copy
# that may still be training, and the method already heals a lost island. syncd
# marks it lost when its heartbeats stop; a rejoin (next epoch) brings it back.
CELERY_TASK_REJECT_ON_WORKER_LOST = False
# Tasks not routed elsewhere are short jobs: the control queue and its worker.
CELERY_TASK_DEFAULT_QUEUE = "control"
# Task modules beside each app's tasks.py, which cannot import them (its run services
# import it): the rest of a run's start (runs.finish_start).
CELERY_IMPORTS = ["webapp.runs.starting"]
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {"hosts": [REDIS_URL]},
    },
}

SESSION_COOKIE_SECURE = PRODUCTION
CSRF_COOKIE_SECURE = PRODUCTION
SECURE_SSL_REDIRECT = flag("SECURE_SSL_REDIRECT", PRODUCTION)
SECURE_HSTS_SECONDS = whole("SECURE_HSTS_SECONDS", 365 * 24 * 3600 if PRODUCTION else 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = flag("SECURE_HSTS_INCLUDE_SUBDOMAINS", PRODUCTION)
SECURE_HSTS_PRELOAD = flag("SECURE_HSTS_PRELOAD", PRODUCTION)
if flag("TRUST_X_FORWARDED_PROTO"):
    # Behind a proxy that ends TLS, its header tells Django the request was HTTPS;
    # without it SECURE_SSL_REDIRECT would redirect forever.
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
