"""The one-command start (webapp/start.py): its Redis, its services, and what it sets
up once."""

import pytest
import redis

from webapp.processes import PROJECT_ROOT, ProcessManager
from webapp.runs.models import Run
from webapp.start import (
    StartError,
    ensure_admin,
    ensure_demo,
    service_commands,
    start_embedded_redis,
)


def test_the_embedded_redis_keeps_its_data_and_port_across_restarts(manager, tmp_path):
    data_dir = tmp_path / "redis"
    url = start_embedded_redis(manager, data_dir)

    with redis.Redis.from_url(url) as client:
        client.set("merged", "version 7")
    assert url.startswith("redis://127.0.0.1:") and not url.endswith(":6379/0")
    with pytest.raises(StartError, match="a Redis server from an earlier start still runs"):
        start_embedded_redis(ProcessManager(tmp_path / "other-logs"), data_dir)
    manager.stop_all(timeout=5)

    assert start_embedded_redis(manager, data_dir) == url
    with redis.Redis.from_url(url) as client:
        assert client.get("merged") == b"version 7"  # from the append-only file


def test_the_embedded_control_redis_fsyncs_each_write_before_it_answers(manager, tmp_path):
    url = start_embedded_redis(manager, tmp_path / "redis")

    with redis.Redis.from_url(url) as client:
        assert client.config_get("appendonly") == {"appendonly": "yes"}
        assert client.config_get("appendfsync") == {"appendfsync": "always"}
    manager.stop_all(timeout=5)


def test_the_embedded_data_plane_writes_nothing_to_disk_and_refuses_past_its_memory(
        manager, tmp_path, monkeypatch):
    monkeypatch.setenv("REDIS_MAXMEMORY_MB", "64")
    url = start_embedded_redis(manager, tmp_path / "dataplane", "dataplane", appendonly=False)

    with redis.Redis.from_url(url) as client:
        assert client.config_get("appendonly") == {"appendonly": "no"}
        assert client.config_get("save") == {"save": ""}
        assert client.config_get("maxmemory") == {"maxmemory": str(64 << 20)}
        assert client.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
    assert (manager.log_dir / "dataplane.log").exists()
    assert not list((tmp_path / "dataplane").glob("*.aof*"))


def test_service_commands_run_a_worker_per_region_and_the_control_worker():
    commands = dict(service_commands(["us-east", "eu-west"], 8123, 3))

    assert list(commands) == ["syncd", "worker-us-east", "worker-eu-west", "worker-control",
                              "web"]
    east = commands["worker-us-east"]
    assert east[east.index("-Q") + 1] == "region.us-east"
    assert east[east.index("-n") + 1] == "us-east@%h"
    assert east[east.index("--autoscale") + 1] == "3,1"  # up to 3 islands, one child idle
    control = commands["worker-control"]
    for worker in (east, control):
        assert {"--without-gossip", "--without-mingle", "--without-heartbeat"} <= set(worker)
    assert control[control.index("-Q") + 1] == "control"
    assert commands["web"][-3:] == ["-p", "8123", "webapp.asgi:application"]
    assert commands["syncd"][1:] == [str(PROJECT_ROOT / "manage.py"), "syncd"]


def test_with_a_pool_each_region_gets_a_pool_manager_after_its_worker():
    commands = service_commands(["us-east", "eu-west"], 8123, 3, pool_size=2)

    names = [name for name, _ in commands]
    assert names == ["syncd", "worker-us-east", "pool-us-east", "worker-eu-west",
                     "pool-eu-west", "worker-control", "web"]
    pool = dict(commands)["pool-eu-west"]
    assert pool[1:] == [str(PROJECT_ROOT / "manage.py"), "pool_manager", "--region", "eu-west",
                        "--size", "2"]



def test_with_the_default_pool_size_the_pool_managers_size_their_pools_by_the_runs():
    pool = dict(service_commands(["us-east"], 8123, 3, pool_size=None))["pool-us-east"]

    assert pool[1:] == [str(PROJECT_ROOT / "manage.py"), "pool_manager", "--region", "us-east"]


@pytest.mark.django_db
def test_the_admin_is_created_once(django_user_model):
    password = ensure_admin()

    admin = django_user_model.objects.get(username="admin")
    assert admin.is_superuser and admin.check_password(password)
    assert ensure_admin() is None
    assert django_user_model.objects.count() == 1


@pytest.mark.django_db
@pytest.mark.integration
def test_the_demo_run_is_created_and_started_once(redis_url, enqueued, operator):
    run = ensure_demo(operator)

    run.refresh_from_db()
    assert (run.name, run.state, run.islands.count()) == ("demo", Run.State.RUNNING, 4)
    assert sorted({call["queue"] for call in enqueued}) == ["region.us-east", "region.us-west"]
    assert len(enqueued) == 4
    assert ensure_demo(operator) is None
    assert Run.objects.count() == 1


@pytest.mark.django_db
@pytest.mark.integration
def test_the_demo_fits_the_regions_this_deployment_has(redis_url, enqueued, settings):
    settings.REGIONS = ["eu-west", "eu-north", "ap-east"]

    run = ensure_demo(None)

    assert sorted({i.region for i in run.islands.all()}) == ["eu-north", "eu-west"]

