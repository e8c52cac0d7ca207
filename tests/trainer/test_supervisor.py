"""The island supervisor with real child processes and a store that stands in for Redis."""

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from supervisor_fakes import (
    GRACEFUL,
    STUBBORN,
    FakeStore,
    process_state,
    python,
    says,
    supervisor,
)

from tests.fixtures import wait_until
from trainer.supervisor import IslandSupervisor


def test_it_kills_the_island_with_sigkill_on_a_kill_command(tmp_path):
    log = tmp_path / "island-0.log"
    store = FakeStore([{"kind": "kill", "epoch": 1}], ready=says(log, "ready"))

    result = supervisor(tmp_path, STUBBORN, store).run()

    assert result == {"island": "island-0", "epoch": 1, "exit_code": -signal.SIGKILL,
                      "ended": "killed"}
    assert "kill: SIGKILL" in log.read_text()


def test_a_stop_lets_the_island_save_its_cursor_and_exit_0(tmp_path):
    log = tmp_path / "island-0.log"
    store = FakeStore([{"kind": "stop", "epoch": 1}], ready=says(log, "ready"))

    result = supervisor(tmp_path, GRACEFUL, store).run()

    assert (result["ended"], result["exit_code"]) == ("stopped", 0)
    assert "forced" not in result
    assert says(log, "cursor saved")()


def test_a_stop_the_island_ignores_ends_in_sigkill_after_the_grace(tmp_path):
    log = tmp_path / "island-0.log"
    store = FakeStore([{"kind": "stop"}], ready=says(log, "ready"))

    started = time.monotonic()
    result = supervisor(tmp_path, STUBBORN, store, stop_grace_s=0.3).run()

    assert (result["ended"], result["exit_code"], result["forced"]) == (
        "stopped", -signal.SIGKILL, True)
    assert time.monotonic() - started < 10


def test_it_ignores_commands_for_another_epoch(tmp_path):
    log = tmp_path / "island-0.log"
    store = FakeStore([{"kind": "kill", "epoch": 1},    # the epoch before
                       {"kind": "kill", "epoch": 3},    # the one after: put back for it
                       {"kind": "stop", "epoch": 2}],
                      ready=says(log, "ready"))

    result = supervisor(tmp_path, GRACEFUL, store, epoch=2).run()

    assert (result["ended"], result["exit_code"]) == ("stopped", 0)
    assert store.sent_back == [{"kind": "kill", "epoch": 3}]
    assert "command for older epoch 1 dropped" in log.read_text()


def test_an_epoch_superseded_before_it_starts_never_starts(tmp_path):
    store = FakeStore(epochs={"island-0": 2})

    result = supervisor(tmp_path, python("open('started', 'w')"), store, epoch=1,
                        cwd=tmp_path).run()

    assert result == {"island": "island-0", "epoch": 1, "exit_code": None,
                      "ended": "superseded"}
    assert not (tmp_path / "started").exists()


def test_a_newer_epoch_stops_the_running_epoch_even_without_a_command(tmp_path):
    log = tmp_path / "island-0.log"
    store = FakeStore(epochs={"island-0": 1})
    sup = supervisor(tmp_path, GRACEFUL, store)
    outcome = {}
    thread = threading.Thread(target=lambda: outcome.update(sup.run()))
    thread.start()
    wait_until(says(log, "ready"))

    store.epochs_["island-0"] = 2  # a rejoin started epoch 2; its "stop" went astray
    thread.join(timeout=10)

    assert (outcome["ended"], outcome["exit_code"]) == ("superseded", 0)
    assert says(log, "cursor saved")()


def test_pause_freezes_the_process_and_resume_lets_it_go_on(tmp_path):
    log = tmp_path / "island-0.log"
    store = FakeStore()
    sup = supervisor(tmp_path, GRACEFUL, store)
    outcome = {}
    thread = threading.Thread(target=lambda: outcome.update(sup.run()))
    thread.start()
    wait_until(says(log, "ready"))
    pid = sup.child.pid

    store.commands.append({"kind": "pause", "epoch": 1})
    wait_until(lambda: process_state(pid) == "T")
    store.commands.append({"kind": "resume", "epoch": 1})
    wait_until(lambda: process_state(pid) in ("R", "S"))
    store.commands.append({"kind": "pause", "epoch": 1})
    wait_until(lambda: process_state(pid) == "T")
    # A stop reaches a paused island too: it is woken up to see its SIGTERM.
    store.commands.append({"kind": "stop", "epoch": 1})
    thread.join(timeout=10)

    assert (outcome["ended"], outcome["exit_code"]) == ("stopped", 0)


def test_it_reports_a_process_that_fails_with_the_end_of_its_log(tmp_path):
    command = python("""
        import sys
        print("loading the corpus", flush=True)
        sys.exit("no such corpus: /nowhere")
    """)

    result = supervisor(tmp_path, command, FakeStore()).run()

    assert (result["ended"], result["exit_code"]) == ("failed", 1)
    assert result["log_tail"][-2] == "no such corpus: /nowhere"


def test_the_logs_last_lines_go_to_the_store_for_the_control_room(tmp_path):
    store = FakeStore()

    supervisor(tmp_path, python("print('step 1 loss 5.5')"), store).run()

    assert store.logs, "nothing shipped"
    assert "step 1 loss 5.5" in store.logs[-1]
    assert store.logs[-1][-1].startswith("[supervisor ") and "ended (exited)" in store.logs[-1][-1]


def test_the_island_is_told_when_it_was_launched(tmp_path):
    before = time.time()
    command = python("""
        import os
        print("launched at", os.environ["ARCHIPELAGO_LAUNCHED_AT"], flush=True)
    """)

    supervisor(tmp_path, command, FakeStore()).run()

    line = next(x for x in (tmp_path / "island-0.log").read_text().splitlines()
                if x.startswith("launched at"))
    assert before <= float(line.split()[-1]) <= time.time()


def test_a_process_that_finishes_on_its_own_has_exited(tmp_path):
    result = supervisor(tmp_path, python("print('run done')"), FakeStore()).run()

    assert (result["ended"], result["exit_code"]) == ("exited", 0)
    assert says(tmp_path / "island-0.log", "run done")()


def test_the_island_keeps_running_while_redis_is_away(tmp_path):
    log = tmp_path / "island-0.log"
    store = FakeStore([{"kind": "kill"}], ready=says(log, "ready"))
    store.failures = 5

    result = supervisor(tmp_path, STUBBORN, store).run()

    assert result["ended"] == "killed"
    text = log.read_text()
    assert "cannot reach Redis" in text and "Redis is back" in text


def supervisor_process(tmp_path, handle_sigterm=False) -> subprocess.Popen:
    """A supervisor in a process of its own, as in a Celery pool process; its island
    writes its pid to child.pid, and "cursor saved" to the log when it gets SIGTERM."""
    script = textwrap.dedent(f"""
        import sys
        from trainer.supervisor import IslandSupervisor

        class Store:
            @property
            def signals(self): return self
            def next_command(self, island): return None
            def send_command(self, island, kind, **args): pass
            def epochs(self): return {{}}
            def put_log(self, island, lines): pass

        command = [sys.executable, "-c",
                   "import os, signal, sys, time\\n"
                   "def stop(*_): print('cursor saved', flush=True); sys.exit(0)\\n"
                   "signal.signal(signal.SIGTERM, stop)\\n"
                   "open('child.pid', 'w').write(str(os.getpid()))\\n"
                   "time.sleep(60)"]
        result = IslandSupervisor(command, Store(), "island-0", 1, "island-0.log",
                                  poll_s=0.02, cwd={str(tmp_path)!r}).run({handle_sigterm})
        print(result["ended"], result["exit_code"], flush=True)
    """)
    return subprocess.Popen([sys.executable, "-c", script], cwd=tmp_path,
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
                            stdout=subprocess.PIPE, text=True)


def island_pid(tmp_path) -> int:
    pid_file = tmp_path / "child.pid"
    wait_until(lambda: pid_file.exists() and pid_file.read_text())
    return int(pid_file.read_text())


def test_the_island_gets_sigterm_when_its_supervisor_dies(tmp_path):
    """A killed worker must not leave its island training beyond kill and stop."""
    parent = supervisor_process(tmp_path)
    try:
        child = island_pid(tmp_path)

        parent.kill()
        parent.wait(timeout=10)

        wait_until(lambda: process_state(child) in ("", "Z"))
        wait_until(says(tmp_path / "island-0.log", "cursor saved"))
    finally:
        if parent.poll() is None:
            parent.kill()
        parent.communicate()


def test_sigterm_to_the_supervisor_stops_its_island_and_ends_the_task(tmp_path):
    """A Celery worker shut down with its process group: its tasks end, none is lost."""
    parent = supervisor_process(tmp_path, handle_sigterm=True)
    try:
        island_pid(tmp_path)

        parent.terminate()
        out, _ = parent.communicate(timeout=10)

        assert (parent.returncode, out.split()) == (0, ["stopped", "0"])
        assert says(tmp_path / "island-0.log", "cursor saved")()
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.communicate()


def test_it_checks_its_arguments(tmp_path):
    with pytest.raises(ValueError, match="poll_s must be more than 0"):
        IslandSupervisor(["true"], FakeStore(), "i", 1, tmp_path / "l", poll_s=0)
    with pytest.raises(ValueError, match="command must name the program"):
        IslandSupervisor([], FakeStore(), "i", 1, tmp_path / "l")



# -- islands of several processes -------------------------------------------------

# A rank of an island in miniature: writes its pid to rank-<RANK>.pid, says its
# environment, then works until it is killed.
RANK = python("""
    import os, time
    open(f"rank-{os.environ['RANK']}.pid", "w").write(str(os.getpid()))
    print("rank", os.environ["RANK"], "of", os.environ["WORLD_SIZE"],
          os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"], flush=True)
    time.sleep(60)
""")


def ranks_said(log: Path) -> list[list[str]]:
    """(rank, world size, address, port) of each rank that said them."""
    lines = log.read_text().splitlines() if log.exists() else []
    return [[line.split()[1], *line.split()[3:]] for line in lines
            if line.startswith("rank ")]


def test_each_process_of_an_island_gets_its_rank_and_one_meeting_point(tmp_path):
    log = tmp_path / "island-0.log"
    store = FakeStore([{"kind": "kill"}], ready=lambda: len(ranks_said(log)) == 2)

    result = supervisor(tmp_path, RANK, store, processes=2, cwd=tmp_path).run()

    assert result["ended"] == "killed"
    said = sorted(ranks_said(log))
    port = said[0][3]
    assert said == [["0", "2", "127.0.0.1", port], ["1", "2", "127.0.0.1", port]]


def test_a_kill_kills_every_process_of_the_island(tmp_path):
    log = tmp_path / "island-0.log"
    store = FakeStore([{"kind": "kill"}], ready=lambda: len(ranks_said(log)) == 2)

    result = supervisor(tmp_path, RANK, store, processes=2, cwd=tmp_path).run()

    assert (result["ended"], result["exit_code"]) == ("killed", -signal.SIGKILL)
    pids = [int((tmp_path / f"rank-{r}.pid").read_text()) for r in range(2)]
    assert all(process_state(pid) == "" for pid in pids)


def test_pause_and_stop_reach_every_process_of_the_island(tmp_path):
    store = FakeStore()
    sup = supervisor(tmp_path, GRACEFUL, store, processes=2)
    outcome = {}
    thread = threading.Thread(target=lambda: outcome.update(sup.run()))
    thread.start()
    log = tmp_path / "island-0.log"
    wait_until(lambda: log.exists() and log.read_text().splitlines().count("ready") == 2)
    pids = [child.pid for child in sup.children]

    store.commands.append({"kind": "pause"})
    wait_until(lambda: all(process_state(pid) == "T" for pid in pids))
    store.commands.append({"kind": "stop"})
    thread.join(timeout=10)

    assert (outcome["ended"], outcome["exit_code"]) == ("stopped", 0)
    # Both processes write to the one log at once, so their lines may interleave.
    after_stop = log.read_text().split("stop: SIGTERM", 1)[1]
    assert after_stop.count("cursor saved") == 2


def test_when_one_process_fails_the_others_are_killed(tmp_path):
    command = python("""
        import os, sys, time
        if os.environ["RANK"] == "1":
            sys.exit(3)
        open("rank-0.pid", "w").write(str(os.getpid()))
        time.sleep(60)
    """)

    started = time.monotonic()
    result = supervisor(tmp_path, command, FakeStore(), processes=2, cwd=tmp_path).run()

    assert (result["ended"], result["exit_code"]) == ("failed", 3)
    assert time.monotonic() - started < 10
    assert "process 1 of 2 ended with exit code 3: SIGKILL to the others" in \
        (tmp_path / "island-0.log").read_text()


def test_a_kill_is_reported_as_a_death_with_its_epoch_and_signal(tmp_path):
    log = tmp_path / "island-0.log"
    store = FakeStore([{"kind": "kill", "epoch": 2}], ready=says(log, "ready"))

    before = time.time()
    supervisor(tmp_path, STUBBORN, store, epoch=2).run()

    (death,) = store.deaths
    assert (death["island"], death["epoch"], death["exit_code"]) == ("island-0", 2,
                                                                      -signal.SIGKILL)
    assert before <= death["at"] <= time.time()


def test_a_region_outage_kill_holds_the_death_back(tmp_path):
    log = tmp_path / "island-0.log"
    store = FakeStore([{"kind": "kill", "epoch": 1, "report": False}],
                      ready=says(log, "ready"))

    result = supervisor(tmp_path, STUBBORN, store).run()

    assert result["ended"] == "killed"
    assert store.deaths == []
    assert "death not reported" in log.read_text()


def test_a_death_from_outside_is_seen_and_reported_within_a_fraction_of_a_second(tmp_path):
    log = tmp_path / "island-0.log"
    store = FakeStore(ready=says(log, "ready"))
    # A slow poll: the supervisor must see the exit by waiting on the child, not polling.
    sup = IslandSupervisor(STUBBORN, store, "island-0", 1, log, poll_s=5.0)
    killed = {}

    def kill_when_ready():
        wait_until(says(log, "ready"))
        killed["at"] = time.time()
        sup.child.send_signal(signal.SIGKILL)

    threading.Thread(target=kill_when_ready, daemon=True).start()
    result = sup.run()

    assert result["ended"] == "failed"
    (death,) = store.deaths
    assert death["exit_code"] == -signal.SIGKILL
    assert death["at"] - killed["at"] < 0.5


def test_a_stop_is_not_a_death(tmp_path):
    log = tmp_path / "island-0.log"
    store = FakeStore([{"kind": "stop", "epoch": 1}], ready=says(log, "ready"))

    supervisor(tmp_path, GRACEFUL, store).run()

    assert store.deaths == []
