"""The environment variables Archipelago reads: every one named here, and read through
one typed accessor each, so that a bad value is refused naming its variable
(`PORT must be a whole number, got 'abc'`).

The web app (webapp/settings.py), the start (webapp/start.py), syncd, an island's
launcher and the island itself and the benchmarks read their settings here; it sits in
syncd, the lowest layer that may read the environment, so that all of them can. The
method (diloco) is handed the values and never reads them. An empty value is the same
as none: the caller's default.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

# What an operator sets; docs/OPERATIONS.md ("Environment") has a row for each, and
# tests/syncd/test_environment.py checks that its table names exactly these.
SETTINGS = frozenset({
    "ALLOWED_HOSTS", "ARCHIPELAGO_PROFILE", "BENCH_RESULTS_DIR", "CELERY_VISIBILITY_TIMEOUT",
    "CHECKPOINT_DIR", "CHROMIUM", "CHUNK_BYTES", "CSRF_TRUSTED_ORIGINS", "DATABASE_URL",
    "DATAPLANE_REDIS_URL", "DATA_DIR", "DATA_ROOTS", "DEBUG", "HOST", "ISLANDS_PER_WORKER",
    "ISLAND_HOST_MEMORY_MB", "ISLAND_POOL_FILL_WAIT_S", "ISLAND_POOL_SIZE", "LOG_DIR",
    "LOGIN_FAILURE_LIMIT", "LOGIN_FAILURE_WINDOW_S", "METRICS_TOKEN", "PORT",
    "REDIS_MAXMEMORY_MB", "REDIS_URL", "REGIONS", "SECRET_KEY", "SECRET_KEY_FILE",
    "SECURE_HSTS_INCLUDE_SUBDOMAINS", "SECURE_HSTS_PRELOAD", "SECURE_HSTS_SECONDS",
    "SECURE_SSL_REDIRECT", "SYNCD_EVAL_CPU_SHARE", "SYNCD_HOST_MEMORY_MB",
    "SYNCD_LEASE_TTL_S", "SYNCD_REGION", "SYNCD_SERVE", "SYNCD_SERVE_CERT", "SYNCD_SERVE_KEY",
    "SYNCD_SERVE_URL", "SYNCD_THREADS", "TRUST_X_FORWARDED_PROTO", "TRUSTED_PROXY_COUNT",
    "VAR_DIR",
})
# What a launcher hands the processes it starts: an island's supervisor its island
# (trainer/launch.py: the Redis URLs, the island's key, its launch times), and torchrun
# the ranks of an island of several processes. Nobody sets these by hand.
HANDED = frozenset({
    "ARCHIPELAGO_ASKED_AT", "ARCHIPELAGO_DATAPLANE_URL", "ARCHIPELAGO_ISLAND_KEY",
    "ARCHIPELAGO_LAUNCHED_AT", "ARCHIPELAGO_REDIS_URL", "LOCAL_RANK", "RANK", "WORLD_SIZE",
})


T = TypeVar("T", int, float)


class SettingError(ValueError):
    """An environment variable's value is not of its type or range; the message names it."""


def _raw(name: str) -> str:
    if name not in SETTINGS and name not in HANDED:
        raise KeyError(f"{name} is not an environment variable of syncd/environment.py")
    return os.environ.get(name, "").strip()


def text(name: str, default: str = "") -> str:
    """The variable's value, or `default` when it is unset or empty."""
    return _raw(name) or default


def flag(name: str, default: bool = False) -> bool:
    """On (1, true, yes, on) or off (0, false, no, off), any case."""
    value = _raw(name).lower()
    if not value:
        return default
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise SettingError(f"{name} must be 1 or 0 (or true/false), got {value!r}.")


def whole(name: str, default: int | None = None, minimum: int | None = None) -> int:
    """A whole number, at least `minimum`; without a default the variable must be set."""
    value = _parsed(name, default, int, "a whole number")
    if minimum is not None and value < minimum:
        raise SettingError(f"{name} must be at least {minimum}, got {value}.")
    return value


def number(name: str, default: float | None = None) -> float:
    """A number; without a default the variable must be set."""
    return _parsed(name, default, float, "a number")


def _parsed(name: str, default: T | None, parse: Callable[[str], T], kind: str) -> T:
    value = _raw(name)
    if not value:
        if default is None:
            raise SettingError(f"{name} must be set.")
        return default
    try:
        return parse(value)
    except ValueError:
        raise SettingError(f"{name} must be {kind}, got {value!r}.") from None


def path(name: str, default: Path) -> Path:
    """A path, or `default`."""
    value = _raw(name)
    return Path(value) if value else default


def data_dir() -> Path:
    """The data directory: DATA_DIR, else var/data in the checkout. The web app and
    the processes that prepare or read corpora (islands, syncd's evaluation, the
    benchmarks), which do not load Django, read it here alike."""
    return path("DATA_DIR", Path(__file__).resolve().parent.parent / "var" / "data")


def items(name: str, default: str, separator: str = ",") -> list[str]:
    """A list split at `separator`; blank items are dropped."""
    return [item.strip() for item in text(name, default).split(separator) if item.strip()]
