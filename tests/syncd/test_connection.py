"""Reaching Redis (syncd/connection.py): a problem said in words, and URLs with their
password hidden."""

import pytest
import redis

from syncd.connection import connect, redact_url, redis_problem

pytestmark = pytest.mark.integration


def test_redis_errors_name_what_is_wrong(redis_url):
    assert redis_problem(redis_url) is None
    assert redact_url("redis://:s3cret@host:6379/0") == "redis://:***@host:6379/0"
    assert redact_url("redis://host:6379/0") == "redis://host:6379/0"
    assert "cannot reach" in redis_problem("redis://127.0.0.1:1/0", timeout_s=1)
    assert "not a Redis URL" in redis_problem("http://example.com/")
    assert isinstance(connect(redis_url), redis.Redis)
