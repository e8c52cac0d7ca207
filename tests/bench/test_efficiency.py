"""The efficiency benchmark (bench/efficiency.py): its arithmetic and report on
figures made up here, and, in the system tier, its quick profile on the real
system, written to its results file as a measurement: the test checks that the
file is complete, not what the figures are."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from bench import efficiency, results

ROOT = Path(__file__).resolve().parents[2]
WORKLOAD_KEYS = {"name", "islands", "ratio", "island_step_ratio", "cpu_share",
                 "idle_cpu_share", "non_island_share", "pulls_of_gap", "merged_tokens_per_s",
                 "bare_tokens_per_s", "island_step_ms", "bare_step_ms", "ratio_per_cpu",
                 "island_cpu_step_ratio"}


def test_the_slope_is_least_squares():
    assert efficiency.slope([(0.0, 1.0), (1.0, 3.0), (2.0, 5.0)]) == pytest.approx(2.0)
    assert efficiency.slope([(0.0, 0.0), (1.0, 2.0), (2.0, 1.0), (3.0, 3.0)]) == \
        pytest.approx(0.8)
    with pytest.raises(ValueError):
        efficiency.slope([(1.0, 1.0)])


def test_every_process_of_the_start_gets_the_kind_of_the_service_it_descends_from():
    table = {1: (0, 0, "python -m webapp.start"), 2: (1, 0, "redis-server *:6379"),
             3: (1, 0, "python manage.py syncd"), 4: (1, 0, "python -m celery -A webapp worker"),
             5: (4, 0, "python -m celery -A webapp worker"),
             6: (5, 0, "python -m trainer.runner --run 1"),
             7: (1, 0, "python manage.py pool_manager --region us-east"),
             8: (7, 0, "python -m trainer.standby"), 9: (7, 0, "python -m trainer.standby"),
             10: (1, 0, "python -m daphne webapp.asgi:application"),
             11: (1, 0, "python -m webapp.guard"), 12: (0, 0, "an engineer's own python")}

    kinds = efficiency.kinds_of(1, table, islands={9})

    assert kinds == {1: "start", 2: "redis", 3: "syncd", 4: "celery", 5: "celery",
                     6: "islands", 7: "pool_managers", 8: "standbys", 9: "islands",
                     10: "web", 11: "start"}
    with pytest.raises(ValueError, match="no known kind"):
        efficiency.kinds_of(1, {**table, 13: (1, 0, "sh -c true")}, set())


def test_the_process_table_leaves_out_an_exited_child_its_parent_has_not_reaped():
    child = subprocess.Popen(["true"])
    try:
        deadline = time.monotonic() + 10
        while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline, "the child never exited"
            time.sleep(0.01)

        table = efficiency.process_table()

        assert child.pid not in table and os.getpid() in table
    finally:
        child.wait()


def meter(ticks: dict[str, int], seconds: float = 10.0) -> dict:
    return {"seconds": seconds, "ticks": {**dict.fromkeys(efficiency.KINDS, 0), **ticks},
            "capacity_ticks": seconds * 100 * 2, "machine_busy_ticks": 1900,
            "machine_all_ticks": 2000}


def phases(island_step_s: float, merged: float, bare_tokens: float) -> tuple:
    runs = [{"merged_tokens_per_s": merged, "cpu": meter({"islands": 1800, "syncd": 150}),
             "islands": {n: {"step_s": island_step_s, "steps": 100, "pull_s_per_step": 0.001}
                         for n in efficiency.REGIONS}, "island_steps": 400}]
    bare = [{"tokens_per_s": bare_tokens, "step_s": 0.1, "tokens": bare_tokens * 10,
             "cpu_s": 20.0, "steps": [100] * 4}] * 2
    return runs, bare, meter({"syncd": 30, "celery": 10})


def test_a_workload_s_figures_come_from_its_phases():
    w = efficiency.summarize("tiny", *phases(0.125, 8_000.0, 10_000.0))

    assert w["ratio"] == 0.8
    assert w["island_step_ratio"] == 0.8
    assert set(w["cpu_share"]) == set(efficiency.KINDS)
    assert w["cpu_share"]["islands"] == 0.9 and w["non_island_share"] == 0.075
    assert w["idle_cpu_share"] == 0.02
    assert w["pulls_of_gap"] == pytest.approx(0.04)  # 1 ms of a 25 ms gap
    # Per CPU-second: 10 s of merges over the system's 19.5 CPU-seconds, 10 s of bare
    # loops' tokens over their 20; an island step's 18 CPU-seconds / 400 against 20 / 400.
    cpu_s = 1950 / efficiency.CLK_TCK
    assert w["ratio_per_cpu"] == pytest.approx(round(80_000 / cpu_s / 5_000, 4))
    assert w["island_cpu_step_ratio"] == pytest.approx(
        round((20 / 400) / (1800 / efficiency.CLK_TCK / 400), 4))


def test_the_report_writes_every_workload_and_says_a_miss(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(results, "RESULTS", tmp_path)
    workloads = [efficiency.summarize("tiny", *phases(0.1, 9_500.0, 10_000.0)),
                 efficiency.summarize("small", *phases(0.125, 8_000.0, 10_000.0))]

    code = efficiency.report(efficiency.PROFILES["quick"], True, workloads, 1.0)

    data = json.loads((tmp_path / "efficiency-quick.json").read_text())
    assert [w["name"] for w in data["workloads"]] == ["tiny", "small"]
    assert code == 1
    assert data["checks"]["tiny: merged / bare tokens/s"]["ok"]
    assert not data["checks"]["small: merged / bare tokens/s"]["ok"]
    assert "FAILED: small: merged / bare tokens/s" in capsys.readouterr().err


@pytest.mark.integration
@pytest.mark.system
def test_the_quick_profile_writes_a_complete_measurement():
    """A measurement, not a timed assertion: the targets may hold or be missed (exit
    code 0 or 1); the results file must be this run's and complete."""
    started = time.time()
    # The system as a user runs it: not in the tests' small chunks (tests/conftest.py).
    env = {k: v for k, v in os.environ.items() if k != "CHUNK_BYTES"}
    out = subprocess.run([sys.executable, "-m", "bench", "efficiency", "--quick"], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=1200)
    # 1 is a target missed, said on stderr; a crash is a traceback, and fails here.
    assert out.returncode in (0, 1) and "Traceback" not in out.stderr, out.stderr[-4000:]
    path = results.RESULTS / "efficiency-quick.json"
    assert path.stat().st_mtime >= started
    data = json.loads(path.read_text())

    assert [w["name"] for w in data["workloads"]] == list(efficiency.WORKLOADS)
    for w in data["workloads"]:
        assert set(w) >= WORKLOAD_KEYS
        assert w["islands"] == len(efficiency.REGIONS)
        assert set(w["cpu_share"]) == set(efficiency.KINDS)
        assert all(0 <= v <= 1 for v in w["cpu_share"].values())
        assert 0 <= w["idle_cpu_share"] <= 1
        assert w["ratio"] > 0 and w["island_step_ratio"] > 0
    assert len(data["checks"]) == 4 * len(data["workloads"])
    assert all(isinstance(c["ok"], bool) for c in data["checks"].values())
    assert data["commit"]

