"""Reaching the runtime's Redis: what is wrong, in a sentence, when it cannot be reached.

Every process of the runtime (web app, syncd, workers, islands) checks REDIS_URL
(the control Redis) and DATAPLANE_REDIS_URL (the data plane, where tensor messages
lie: syncd.run_keys) with redis_problem before it starts, names them in logs through
redact_url, and opens its clients with connect.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

import redis
from redis.backoff import ExponentialBackoff
from redis.connection import Encoder, PythonRespSerializer
from redis.retry import Retry

# About 8 s of retries with backoff: time for a Redis to restart and load its data.
RESTART_RETRIES = 12
# Bytes a connection takes off its socket per read: tensor messages arrive in chunks of
# megabytes (syncd/bulk.py), and the parser (hiredis) is fed once per read.
SOCKET_READ_BYTES = 1 << 20
# Commands are packed by redis-py's own Python serializer, not hiredis's: it passes a
# value of more than BUFFER_CUTOFF bytes (a memoryview of a chunk, syncd/bulk.py) to the
# socket as it is, where hiredis's copies every chunk into a new command first, which
# makes a large message's write several times slower (bench dataplane's transport
# limit); small commands cost a few microseconds more to pack.
BUFFER_CUTOFF = 6000  # redis-py's default
COMMAND_PACKER = PythonRespSerializer(BUFFER_CUTOFF, Encoder("utf-8", "strict", False).encode)


def redact_url(url: str) -> str:
    """The URL with its password (if any) replaced by ***, fit for logs and messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    userinfo = f"{parts.username or ''}:***"
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{userinfo}@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def redis_problem(url: str, timeout_s: float = 5.0, setting: str = "REDIS_URL") -> str | None:
    """None if the Redis at `url` answers a PING; otherwise what is wrong, in a sentence.

    A Redis across a wide-area link is reached with its password and, for TLS, a
    rediss:// URL in REDIS_URL (docs/OPERATIONS.md); this names the part that failed,
    and the setting the URL came from (`setting`).
    """
    shown = redact_url(url)
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=timeout_s,
                                      socket_timeout=timeout_s)
    except ValueError as e:
        return f"{setting} {shown!r} is not a Redis URL: {e}"
    try:
        client.ping()
    except redis.AuthenticationError as e:
        if urlsplit(url).password is None:
            return (f"the Redis at {shown} wants a password ({e}); put it in {setting}: "
                    "redis://:PASSWORD@HOST:PORT/0 (rediss:// for TLS)")
        return f"the Redis at {shown} refused the password in {setting} ({e})"
    except redis.ConnectionError as e:
        return f"cannot reach the Redis at {shown}: {e}"
    except redis.RedisError as e:
        return f"the Redis at {shown} did not answer a PING: {e}"
    finally:
        client.close()
    return None


def connect(url: str, *, ride_out_restarts: bool = False) -> redis.Redis:
    """A binary-safe client; every caller decodes what it reads itself. Replies are
    parsed by hiredis (a dependency), read off the socket SOCKET_READ_BYTES at a time;
    commands are packed without copying large values (COMMAND_PACKER).

    Args:
        url: redis:// or rediss:// URL, password included.
        ride_out_restarts: retry a command for a few seconds when the connection drops
            (a Redis restarting and loading its append-only file). For islands, whose
            writes are idempotent for syncd (an update is known by its seq); not for
            syncd, whose merge transaction must not run twice.
    """
    if not ride_out_restarts:
        return redis.Redis.from_url(url, decode_responses=False, health_check_interval=30,
                                    socket_read_size=SOCKET_READ_BYTES,
                                    command_packer=COMMAND_PACKER)
    return redis.Redis.from_url(
        url, decode_responses=False, health_check_interval=30,
        socket_read_size=SOCKET_READ_BYTES, command_packer=COMMAND_PACKER,
        retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), RESTART_RETRIES),
        retry_on_error=[redis.ConnectionError, redis.TimeoutError, ConnectionResetError,
                        redis.BusyLoadingError])
