"""Messages in chunks, against a real Redis."""

from array import array

import pytest

from syncd.bulk import (
    PUT_WINDOW,
    READ_WINDOW,
    BulkError,
    BulkRef,
    RedisBulk,
    chunk_bytes_setting,
)
from syncd.connection import connect

pytestmark = pytest.mark.integration

MESSAGE = bytes(range(256)) * 20 + b"x" * 80  # 5,200 bytes: 5 chunks of 1,024 and one more


@pytest.fixture
def bulk(redis_url):
    return RedisBulk(connect(redis_url), chunk_bytes=1024)


def test_a_message_of_several_chunks_round_trips(bulk):
    ref = bulk.put("m", MESSAGE, ttl_s=60)

    assert (ref.chunks, ref.size) == (6, len(MESSAGE))
    assert all(len(bulk.client.get(k)) <= 1024 for k in ref.chunk_keys())
    assert bulk.read(ref, max_bytes=1 << 20) == MESSAGE


def test_a_message_of_a_chunk_count_the_window_does_not_divide_round_trips(bulk):
    ref = bulk.put("m", MESSAGE[:4100], ttl_s=60)

    assert ref.chunks == 5
    assert bulk.read(ref, max_bytes=1 << 20) == MESSAGE[:4100]


def counting_executes(bulk, monkeypatch) -> list[int]:
    """The commands in each round trip of the bulk's pipelines, as they happen."""
    asked = []
    pipeline = bulk.client.pipeline

    def counting_pipeline(*args, **kwargs):
        pipe = pipeline(*args, **kwargs)
        execute = pipe.execute

        def counted(*a, **k):
            asked.append(len(pipe))
            return execute(*a, **k)

        pipe.execute = counted
        return pipe

    monkeypatch.setattr(bulk.client, "pipeline", counting_pipeline)
    return asked


@pytest.mark.parametrize("cuts", [
    [10, 1024, 3000, 3000, 5200],  # pieces inside a chunk, across chunks, one empty
    [1024, 2048, 4096],  # pieces on the chunk boundaries, the last chunk full
    [5200],  # one piece
])
def test_a_message_in_pieces_is_stored_as_the_message_they_make(bulk, cuts):
    pieces = [memoryview(MESSAGE[a:b]) for a, b in zip([0, *cuts[:-1]], cuts, strict=True)]

    ref = bulk.put("m", pieces, ttl_s=60)

    whole = MESSAGE[:cuts[-1]]
    assert (ref.chunks, ref.size) == (-(-len(whole) // 1024), len(whole))
    assert bulk.read(ref, max_bytes=1 << 20) == whole


def test_pieces_of_any_item_size_and_an_empty_message_are_stored_as_bytes(bulk):
    floats = array("f", [0.5] * 300)  # 1,200 bytes in items of 4

    ref = bulk.put("m", [memoryview(b"head"), memoryview(floats)], ttl_s=60)
    empty = bulk.put("e", [memoryview(b""), memoryview(b"")], ttl_s=60)

    assert bulk.read(ref, max_bytes=1 << 20) == b"head" + floats.tobytes()
    assert (empty.chunks, empty.size) == (1, 0)
    assert bulk.read(empty, max_bytes=1 << 20) == b""


def test_a_message_in_pieces_is_sent_at_most_a_window_of_chunks_at_once(bulk, monkeypatch):
    """What bounds the chunks a writer joins from pieces before they are sent."""
    message = MESSAGE * 8  # 41 chunks
    pieces = [memoryview(message[i:i + 700]) for i in range(0, len(message), 700)]
    asked = counting_executes(bulk, monkeypatch)

    ref = bulk.put("m", pieces, ttl_s=60)

    assert ref.chunks == 41
    assert max(asked) == PUT_WINDOW and sum(asked) == 41
    assert bulk.read(ref, max_bytes=1 << 20) == message


def test_a_read_asks_for_at_most_a_window_of_chunks_at_once(bulk, monkeypatch):
    """What bounds a reader's reply buffers (and Redis's output buffer for it)."""
    ref = bulk.put("m", MESSAGE, ttl_s=60)
    asked = counting_executes(bulk, monkeypatch)

    assert bulk.read(ref, max_bytes=1 << 20) == MESSAGE
    assert sum(asked) == ref.chunks
    assert max(asked) <= READ_WINDOW
    assert len(asked) == -(-ref.chunks // READ_WINDOW)


def test_a_missing_chunk_is_an_error_that_names_it(bulk):
    ref = bulk.put("m", MESSAGE, ttl_s=60)
    bulk.client.delete("m:2")

    with pytest.raises(BulkError, match="chunk 3 of 6 is missing"):
        bulk.read(ref, max_bytes=1 << 20)


@pytest.mark.parametrize("ref, reason", [
    (BulkRef("m", 6, len(MESSAGE) + 1), "hold 5200 bytes, the message 5201"),
    (BulkRef("m", 6, len(MESSAGE) - 1), "runs past"),
    (BulkRef("m", 6, 1 << 21), "exceeds the limit"),
    (BulkRef("m", 0, 10), "cannot hold"),
])
def test_chunks_that_do_not_add_up_to_the_reference_are_refused(bulk, ref, reason):
    bulk.put("m", MESSAGE, ttl_s=60)

    with pytest.raises(BulkError, match=reason):
        bulk.read(ref, max_bytes=1 << 20)


def test_chunks_expire_until_persisted_and_go_when_deleted(bulk):
    ref = bulk.put("m", MESSAGE, ttl_s=60)
    assert all(0 < bulk.client.ttl(k) <= 60 for k in ref.chunk_keys())

    pipe = bulk.client.pipeline()
    bulk.persist(pipe, ref)
    pipe.execute()
    assert all(bulk.client.ttl(k) == -1 for k in ref.chunk_keys())

    pipe = bulk.client.pipeline()
    bulk.delete(pipe, ref)
    pipe.execute()
    assert not any(bulk.client.exists(k) for k in ref.chunk_keys())


def test_the_chunk_size_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("CHUNK_BYTES", "4096")
    assert chunk_bytes_setting() == 4096
    monkeypatch.setenv("CHUNK_BYTES", "12")
    with pytest.raises(ValueError, match="at least 1024"):
        chunk_bytes_setting()
    monkeypatch.delenv("CHUNK_BYTES")
    assert chunk_bytes_setting() == 4 << 20


def test_a_reference_names_no_more_chunk_keys_than_its_size_allows():
    forged = BulkRef("m", 2**62, 3000)

    assert forged.chunk_keys() == ["m:0", "m:1", "m:2"]
    with pytest.raises(BulkError, match="cannot hold"):
        forged.check(1 << 20)


def test_the_deletion_of_a_forged_reference_deletes_what_its_size_allows_and_no_more(bulk):
    bulk.put("m", MESSAGE, ttl_s=60)
    bulk.client.set("m:9", "beyond")
    pipe = bulk.client.pipeline(transaction=False)

    bulk.delete(pipe, BulkRef("m", 2**62, 2048))  # at most 2 chunks of 1,024 bytes
    pipe.execute()

    assert not bulk.client.exists("m:0", "m:1")
    assert bulk.client.exists("m:2", "m:9") == 2


def test_a_chunk_of_another_type_in_its_place_is_a_bulk_error(bulk):
    ref = bulk.put("m", MESSAGE, ttl_s=60)
    bulk.client.delete("m:1")
    bulk.client.hset("m:1", "a", "b")

    with pytest.raises(BulkError, match="not a string"):
        bulk.read(ref, max_bytes=1 << 20)
