"""bench utilization: the figure between two heartbeats and its target (the run end to
end is in tests/bench/test_dataplane.py, which runs it after the data plane's
configs)."""

import pytest

from bench import utilization
from syncd.records import Heartbeat


def beat(step: int, time: float, pull_wait_s: float = 0.0, late_globals: int = 0
         ) -> Heartbeat:
    return Heartbeat.bare(1, time, step, 0, pull_wait_s=pull_wait_s, late_globals=late_globals,
                          pulls=step // 2)


def test_utilization_is_the_steps_at_bare_speed_over_the_wall_time_between_two_beats():
    u = utilization.utilization_between(beat(8, 100.0, 0.5, 1), beat(40, 180.0, 2.5, 3), 2.4)

    assert u["value"] == pytest.approx(32 * 2.4 / 80.0)  # 0.96
    assert (u["steps"], u["wall_s"], u["island_step_s"]) == (32, 80.0, 2.5)
    assert (u["pull_wait_s"], u["late_globals"], u["pulls"]) == (2.0, 2, 16)
    with pytest.raises(ValueError, match="0 steps"):
        utilization.utilization_between(beat(8, 100.0), beat(8, 101.0), 2.4)


def test_utilization_is_judged_from_85m_parameters():
    small = utilization.checks({"params": 5_000_000, "value": 0.5})
    gpt2 = utilization.checks({"params": 85_562_880, "value": 0.94})

    assert small == {}
    assert gpt2["island utilization"] == {"value": 0.94, "bound": ">= 0.95", "ok": False}
