"""Reaching Redis (syncd/connection.py): a problem said in words, and URLs with their
password hidden."""

import pytest
import redis
from redis.utils import HIREDIS_AVAILABLE

from syncd.connection import SOCKET_READ_BYTES, connect, redact_url, redis_problem

pytestmark = pytest.mark.integration


def test_redis_errors_name_what_is_wrong(redis_url):
    assert redis_problem(redis_url) is None
    assert redact_url("redis://:s3cret@host:6379/0") == "redis://:***@host:6379/0"
    assert redact_url("redis://host:6379/0") == "redis://host:6379/0"
    assert "cannot reach" in redis_problem("redis://127.0.0.1:1/0", timeout_s=1)
    assert "not a Redis URL" in redis_problem("http://example.com/")
    assert isinstance(connect(redis_url), redis.Redis)


def test_replies_are_parsed_by_hiredis_a_megabyte_per_socket_read(redis_url):
    """The transport bench/dataplane.py chose: the Python parser reads large values at
    a fraction of the speed."""
    assert HIREDIS_AVAILABLE
    for ride_out_restarts in (False, True):
        client = connect(redis_url, ride_out_restarts=ride_out_restarts)
        assert client.connection_pool.connection_kwargs["socket_read_size"] == \
            SOCKET_READ_BYTES
        client.close()


def test_a_large_value_goes_to_the_socket_as_it_is_not_copied_into_a_command(redis_url):
    """hiredis's packer copies each chunk of a tensor message into a new command; the
    Python one hands the chunk's memoryview to the socket."""
    for ride_out_restarts in (False, True):
        client = connect(redis_url, ride_out_restarts=ride_out_restarts)
        chunk = memoryview(bytearray(b"x" * (1 << 20)))
        connection = client.connection_pool.get_connection()
        try:
            packed = connection.pack_commands([("SET", "big", chunk)])
        finally:
            client.connection_pool.release(connection)

        assert any(piece is chunk for piece in packed)
        client.set("big", chunk)
        assert client.get("big") == bytes(chunk)
        client.close()
