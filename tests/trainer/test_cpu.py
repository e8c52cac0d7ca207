"""An island process's share of its host's CPU (trainer/cpu.py)."""

from trainer.cpu import CpuMeter, process_cpu_s


class Times:
    def __init__(self) -> None:
        self.wall, self.cpu = 0.0, 0.0


def test_the_share_is_cpu_time_over_wall_time_and_the_hosts_cores_per_window():
    t = Times()
    meter = CpuMeter(cores=4, window_s=2.0, clock=lambda: t.wall, cpu=lambda: t.cpu)

    assert meter.share() is None  # no window has passed yet
    t.wall, t.cpu = 1.0, 1.0
    assert meter.share() is None
    t.wall, t.cpu = 2.0, 2.0  # a whole core of four for 2 s
    assert meter.share() == 0.25
    t.wall, t.cpu = 3.0, 2.25
    assert meter.share() == 0.25  # the last full window's, until the next one ends
    t.wall, t.cpu = 4.0, 2.5  # half a core since the last window
    assert meter.share() == 0.0625


def test_a_process_that_works_shows_cpu_seconds_of_its_own():
    before = process_cpu_s()
    sum(i * i for i in range(2_000_000))

    assert process_cpu_s() > before
