"""The bulk path: the messages that carry tensors, stored in chunks.

Update messages, published fragments, their differences and the outer momentum
can be gigabytes each (a 1B-parameter fragment in fp32 is 4 GB), more than a
Redis value may hold (512 MiB by default) and more than one command should
carry. So each is written as chunks of at most `chunk_bytes` under one key
prefix, `<key>:0`, `<key>:1`, ..., and named by a `BulkRef` (key, chunk count,
total size) that the small control messages carry instead: a stream entry, a
pointer key. A message is signed whole (diloco.protocol), so a chunk that is
missing, out of order or forged fails its reader's checks and is never merged.

A published fragment's full message may instead lie in syncd's own file of it
(syncd.published_files) and be served over HTTP (syncd.published_server): its
reference is then a `ServedRef` (where syncd serves it, its size, and the
run's read token that syncd hands the run's islands through the reference, which
only they and syncd can read), and `read_served` reads it into one buffer. So a
merge's full message is written once, to the file, instead of to the file and to
the data plane. `load_ref` tells the two kinds of reference apart.

Chunks are written with a time to live, a backstop for a message nobody reads;
the write that makes a message part of the run's state (syncd's publish) makes
its chunks persistent in the same MULTI/EXEC. Only this class knows how chunks
are laid out, so a blob store (an object store, a shared file system) can later
carry the tensors while Redis keeps the control messages.

The transport, chosen by measurement (`python -m bench dataplane`,
docs/journal/benchmarks-2026.md): replies are parsed by hiredis (syncd.connection), chunks are
4 MiB, and a message is read READ_WINDOW chunks per round trip, each copied once
into the one buffer allocated for the whole message. So a reader holds at most
READ_WINDOW x chunk_bytes of replies besides its message (8 MiB by default), and
Redis at most as much in its output buffer for that reader's connection.
A message may be written from pieces (diloco.protocol.encode_pieces: views of the
tensors it carries): a chunk inside one piece is sent as a view of it, one across
pieces is joined, and such chunks go PUT_WINDOW per round trip, so a writer holds
at most PUT_WINDOW x chunk_bytes of joined chunks, never a copy of the message.
"""

from __future__ import annotations

import http.client
import json
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit

import redis
from redis.client import Pipeline

from syncd.environment import whole

DEFAULT_CHUNK_BYTES = 4 << 20
MIN_CHUNK_BYTES = 1024
CHUNK_BYTES_ENV = "CHUNK_BYTES"
READ_WINDOW = 2  # chunks asked for in one round trip
PUT_WINDOW = 16  # chunks of a message in pieces sent in one round trip
SERVED_TIMEOUT_S = 30.0  # the longest wait on syncd's server for a connection or bytes


class BulkError(ValueError):
    """A message that cannot be read whole; str() says why."""


def max_chunks(size: int) -> int:
    """The most chunks a message of `size` bytes lies in: chunks are at least
    MIN_CHUNK_BYTES but the last."""
    return max(1, -(-size // MIN_CHUNK_BYTES))


@dataclass(frozen=True)
class BulkRef:
    """Where a message lies: its key prefix, how many chunks, how many bytes."""

    key: str
    chunks: int
    size: int

    def chunk_keys(self) -> list[str]:
        """The keys of its chunks: at most as many as its size allows (`max_chunks`),
        whatever chunk count it claims, so a forged count names no more keys."""
        return [f"{self.key}:{i}" for i in range(min(self.chunks, max_chunks(self.size)))]

    def check(self, max_bytes: int) -> None:
        """Raise BulkError if the message is larger than `max_bytes` or claims more chunks
        than chunks of at least MIN_CHUNK_BYTES make (or none)."""
        if self.size > max_bytes:
            raise BulkError(f"message of {self.size} bytes exceeds the limit of {max_bytes}")
        if not 1 <= self.chunks <= max_chunks(self.size):
            raise BulkError(f"{self.chunks} chunks cannot hold {self.size} bytes")

    def dumps(self) -> str:
        return json.dumps({"key": self.key, "chunks": self.chunks, "size": self.size})

    @classmethod
    def loads(cls, raw: bytes | str) -> BulkRef:
        try:
            ref = json.loads(raw)
            return cls(str(ref["key"]), int(ref["chunks"]), int(ref["size"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise BulkError(f"not a message reference: {exc}") from exc


@dataclass(frozen=True)
class ServedRef:
    """A message syncd serves over HTTP: its address, its size and the read token the
    server asks for (never logged: `repr` leaves it out)."""

    url: str
    size: int
    token: str

    def __repr__(self) -> str:
        return f"ServedRef(url={self.url!r}, size={self.size})"

    def dumps(self) -> str:
        return json.dumps({"url": self.url, "size": self.size, "token": self.token})


@dataclass(frozen=True)
class Served:
    """Where syncd serves one run's published messages (syncd.published_server), and the
    run's read token there."""

    base_url: str
    run_id: str
    token: str

    def __repr__(self) -> str:
        return f"Served(base_url={self.base_url!r}, run_id={self.run_id!r})"

    def ref(self, fragment: int, version: int, fencing_token: int, size: int) -> ServedRef:
        """The reference of `fragment`'s full message at `version`, in the file of the
        grant of `fencing_token`."""
        return ServedRef(f"{self.base_url}/published/{self.run_id}/{fragment}/{version}/"
                         f"{fencing_token}", size, self.token)


def load_ref(raw: bytes | str) -> BulkRef | ServedRef:
    """The reference a pointer key holds: chunks on the data plane, or served by syncd.

    Raises:
        BulkError: not a reference of either kind.
    """
    try:
        ref = json.loads(raw)
        if isinstance(ref, dict) and "url" in ref:
            if not str(ref["url"]).startswith(("http://", "https://")):
                raise ValueError(f"not an http:// or https:// address: {ref['url']!r}")
            return ServedRef(str(ref["url"]), int(ref["size"]), str(ref["token"]))
    except (ValueError, KeyError, TypeError) as exc:
        raise BulkError(f"not a message reference: {exc}") from exc
    return BulkRef.loads(raw)


def read_served(ref: ServedRef, max_bytes: int) -> bytearray:
    """The message syncd serves at `ref`, read straight into one buffer of its size.

    Raises:
        BulkError: larger than `max_bytes`, the server unreachable or slower than
            SERVED_TIMEOUT_S, or its answer not the whole message (it holds another
            version now, the token is refused, the bytes end early).
    """
    if ref.size > max_bytes:
        raise BulkError(f"message of {ref.size} bytes exceeds the limit of {max_bytes}")
    parts = urlsplit(ref.url)
    if parts.scheme == "https":  # checked against this host's trusted authorities
        connection: http.client.HTTPConnection = http.client.HTTPSConnection(
            parts.hostname or "", parts.port, timeout=SERVED_TIMEOUT_S,
            context=ssl.create_default_context())
    else:
        connection = http.client.HTTPConnection(parts.hostname or "", parts.port,
                                                timeout=SERVED_TIMEOUT_S)
    try:
        connection.request("GET", parts.path, headers={"Authorization": f"Bearer {ref.token}"})
        response = connection.getresponse()
        if response.status != 200:
            raise BulkError(f"{ref.url} answered {response.status} {response.reason}")
        if response.length != ref.size:
            raise BulkError(f"{ref.url} holds {response.length} bytes, the reference {ref.size}")
        buffer = bytearray(ref.size)
        view = memoryview(buffer)
        pos = 0
        while pos < ref.size:
            got = response.readinto(view[pos:])
            if not got:
                raise BulkError(f"{ref.url} ended after {pos} of {ref.size} bytes")
            pos += got
        return buffer
    except (OSError, http.client.HTTPException) as exc:
        raise BulkError(f"{ref.url} could not be read: {exc}") from exc
    finally:
        connection.close()


def _chunks(pieces: list[memoryview], chunk_bytes: int) -> Iterator[memoryview | bytes]:
    """The message the pieces make, in chunks of `chunk_bytes` (the last shorter, one
    empty chunk for an empty message): a view of a piece where a chunk lies inside
    one, else the parts joined."""
    parts: list[memoryview] = []
    held = 0
    for piece in pieces:
        view = piece.cast("B") if piece.format != "B" or piece.ndim != 1 else piece
        while len(view):
            take = view[:chunk_bytes - held]
            view = view[len(take):]
            parts.append(take)
            held += len(take)
            if held == chunk_bytes:
                yield parts[0] if len(parts) == 1 else b"".join(parts)
                parts, held = [], 0
    if parts or not any(piece.nbytes for piece in pieces):
        yield parts[0] if len(parts) == 1 else b"".join(parts)


def as_pieces(message: bytes | bytearray | memoryview | list[memoryview]) -> list[memoryview]:
    """A message as its pieces, in order: itself as one view if it is not in pieces."""
    return message if isinstance(message, list) else [memoryview(message)]


def chunk_bytes_setting() -> int:
    """The chunk size: `CHUNK_BYTES` in the environment, 4 MiB by default."""
    return whole(CHUNK_BYTES_ENV, DEFAULT_CHUNK_BYTES, minimum=MIN_CHUNK_BYTES)


class RedisBulk:
    """Messages as chunks in Redis.

    Args:
        client: a binary-safe connection (syncd.connection.connect).
        chunk_bytes: the largest chunk; default from `chunk_bytes_setting`.
    """

    def __init__(self, client: redis.Redis, chunk_bytes: int | None = None):
        self.client = client
        self.chunk_bytes = chunk_bytes or chunk_bytes_setting()

    def ref(self, key: str, size: int) -> BulkRef:
        """Where `put` lays a message of `size` bytes under `key`."""
        return BulkRef(key, max(1, -(-size // self.chunk_bytes)), size)

    def put(self, key: str, message: bytes | bytearray | memoryview | list[memoryview],
            ttl_s: int, pipe: Pipeline | None = None) -> BulkRef:
        """Write `message` (or its pieces, in order) as chunks under `key` with a time to
        live; with `pipe`, queue the writes there instead of sending them.

        Raises:
            redis.OutOfMemoryError: (sent here) Redis is at its maxmemory; the chunks that
                were written are deleted again, so a refused message holds no memory.
        """
        pieces = as_pieces(message)
        ref = self.ref(key, sum(piece.nbytes for piece in pieces))
        target = pipe if pipe is not None else self.client.pipeline(transaction=False)
        try:
            for i, (chunk_key, chunk) in enumerate(zip(ref.chunk_keys(),
                                                       _chunks(pieces, self.chunk_bytes),
                                                       strict=True)):
                target.set(chunk_key, chunk, ex=ttl_s)
                if pipe is None and (i + 1) % PUT_WINDOW == 0:
                    target.execute()
            if pipe is None:
                target.execute()
        except redis.OutOfMemoryError:
            self.client.delete(*ref.chunk_keys())
            raise
        return ref

    def read(self, ref: BulkRef, max_bytes: int) -> bytearray:
        """The message, read READ_WINDOW chunks per round trip into one buffer.

        Raises:
            BulkError: larger than `max_bytes`, more chunks than chunks of at least
                MIN_CHUNK_BYTES make, a chunk missing or not a string (a key of
                another type in its place), or chunks that do not add up to the size
                the reference gives.
        """
        ref.check(max_bytes)
        buffer = bytearray(ref.size)
        view = memoryview(buffer)
        keys = ref.chunk_keys()
        pos = 0
        for first in range(0, ref.chunks, READ_WINDOW):
            pipe = self.client.pipeline(transaction=False)
            for chunk_key in keys[first:first + READ_WINDOW]:
                pipe.get(chunk_key)
            try:
                replies = pipe.execute()
            except redis.ResponseError as exc:  # WRONGTYPE: a hash, a list... in its place
                raise BulkError(f"a chunk of {ref.key} is not a string: {exc}") from exc
            for i, chunk in enumerate(replies, first):
                if chunk is None:
                    raise BulkError(f"chunk {i + 1} of {ref.chunks} is missing (expired or "
                                    "replaced)")
                if pos + len(chunk) > ref.size:
                    raise BulkError(f"chunk {i + 1} of {ref.chunks} runs past the "
                                    f"message's {ref.size} bytes")
                view[pos:pos + len(chunk)] = chunk
                pos += len(chunk)
        if pos != ref.size:
            raise BulkError(f"the chunks hold {pos} bytes, the message {ref.size}")
        return buffer

    def persist(self, pipe: Pipeline, ref: BulkRef) -> None:
        """Queue the removal of the chunks' time to live: the message is the run's state."""
        for chunk_key in ref.chunk_keys():
            pipe.persist(chunk_key)

    def delete(self, pipe: Pipeline, ref: BulkRef) -> None:
        """Queue the deletion of the message's chunks: at most as many as its size
        allows (`BulkRef.chunk_keys`), whatever count a forged reference claims."""
        pipe.delete(*ref.chunk_keys())
