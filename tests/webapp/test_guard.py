"""The guard (webapp/guard.py): the processes of a manager that dies without a word
are stopped all the same, in the manager's order."""

import subprocess

from tests.webapp.test_processes import gone, leaves_a_child, python, slow_to_stop
from webapp.processes import wait_for


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


def test_the_guard_stops_a_process_that_outlived_its_group_leader(tmp_path):
    """The manager tells the guard of a group whose leader ended only once it is empty."""
    pid_file, ready = tmp_path / "child.pid", tmp_path / "ready"
    starter = subprocess.Popen(python(f"""
        import time
        from webapp.processes import ProcessManager
        manager = ProcessManager({str(tmp_path / "logs")!r})
        manager.start("worker", {leaves_a_child(pid_file)!r}, restart=True)
        while not any("started again" in line for line in manager.check()):
            time.sleep(0.05)
        open({str(ready)!r}, "w").write("ready")
        time.sleep(60)
    """))
    wait_for(ready.exists, 20, "the worker started again")
    child = int(pid_file.read_text())
    assert not gone(child)

    starter.kill()
    starter.wait()

    wait_for(lambda: gone(child), 15, "the child of the first worker gone")
