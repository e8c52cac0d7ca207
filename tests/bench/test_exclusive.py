"""One benchmark at a time on a machine (bench/exclusive.py)."""

import subprocess
import sys

from bench.exclusive import alone, holder


def test_a_held_machine_names_its_benchmark_and_is_free_afterwards(tmp_path):
    lock = tmp_path / "bench.lock"
    assert holder(lock) is None
    with alone("convergence --quick", lock):
        assert holder(lock).startswith("convergence --quick, pid ")
    assert holder(lock) is None


def test_a_second_benchmark_waits_for_the_first_and_says_for_which(tmp_path):
    lock = tmp_path / "bench.lock"
    second = [sys.executable, "-c",
              f"from bench.exclusive import alone\n"
              f"with alone('wan', __import__('pathlib').Path({str(lock)!r})):\n"
              f"    print('ran')"]
    with alone("scale", lock):
        waiting = subprocess.Popen(second, stdout=subprocess.PIPE, text=True)
        assert waiting.stdout.readline().startswith(
            "Waiting for the benchmark running on this machine to finish (scale, pid ")
        assert waiting.poll() is None  # still waiting while the first holds the machine
    out, _ = waiting.communicate(timeout=30)
    assert out == "ran\n" and waiting.returncode == 0
