"""The island keeps heartbeating while its main thread is busy starting up."""

import time

from trainer.link import beating


def test_beating_calls_beat_while_the_body_runs_and_stops_after():
    beats = []

    with beating(lambda: beats.append(time.monotonic()), every_s=0.01):
        deadline = time.monotonic() + 5
        while len(beats) < 3 and time.monotonic() < deadline:
            time.sleep(0.005)  # a busy main thread, as when the corpus loads
    after = len(beats)
    time.sleep(0.05)

    assert after >= 3
    assert len(beats) == after  # no beat once the body is over
