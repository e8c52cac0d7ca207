"""An island's phase (diloco/phase.py): when it sends each fragment, and how it follows
the lead in phase its merges report."""

import pytest

from diloco.config import SyncConfig
from diloco.fragments import due_fragments
from diloco.phase import MIN_SHIFT_STEPS, Phase, in_pace

H, P = 20, 4


def sends(phase: Phase, steps: range) -> dict[int, list[int]]:
    """Fragment -> the inner steps after which it is sent."""
    out: dict[int, list[int]] = {}
    for step in steps:
        for p in phase.due(step):
            out.setdefault(p, []).append(step)
    return out


def paced(phase: Phase, step_s: float, steps: int = 5) -> Phase:
    for step in range(1, steps + 1):
        phase.stepped(step, step * step_s)
    return phase


def test_an_island_in_phase_sends_each_fragment_when_due_fragments_says():
    phase = Phase(H, P, follow=True)

    assert all(phase.due(step) == due_fragments(step, H, P) for step in range(1, 3 * H))


def test_a_lead_puts_every_send_off_by_as_many_of_the_islands_steps_once():
    phase = paced(Phase(H, P, follow=True), step_s=0.05)
    assert sends(phase, range(1, 10)) == {0: [5]}

    # its update sent after step 5 waited 0.3 s for the round's latest: 6 steps
    assert phase.lead(seq=5, lead_s=0.3, step=9) == 6
    # every fragment's next send comes 6 steps later: one window of H + 6 steps each
    # (fragment 0, due again 6 steps after its send, waits for its next due step)
    assert sends(phase, range(10, 60)) == {1: [16, 36, 56], 2: [21, 41], 3: [26, 46],
                                           0: [31, 51]}
    # a lead reported for a send made before the shift is of the old phase
    assert phase.lead(seq=5, lead_s=0.3, step=12) == 0
    assert phase.lead(seq=8, lead_s=0.3, step=12) == 0
    assert phase.offset == 6
    # one of a send in the new phase is followed again
    assert phase.lead(seq=16, lead_s=0.1, step=20) == 2 and phase.offset == 8


def test_a_lead_under_the_smallest_shift_or_of_an_island_that_waits_is_not_followed():
    assert paced(Phase(H, P, follow=True), 0.05).lead(5, 0.05 * (MIN_SHIFT_STEPS - 0.6), 9) == 0
    waits = paced(Phase.of(SyncConfig(inner_steps=H, fragments=P, overlap_steps=0)), 0.05)
    assert waits.lead(5, 0.5, 9) == 0 and waits.offset == 0
    assert not Phase.of(SyncConfig(overlap_steps=1), barrier=True).follow
    assert Phase.of(SyncConfig(overlap_steps=1)).follow
    assert Phase(H, P, follow=True).lead(5, 0.5, 9) == 0  # no pace yet


def test_a_shift_is_at_most_a_period_less_a_step():
    phase = paced(Phase(H, P, follow=True), step_s=0.05)

    assert phase.shift_for(10.0) == H - 1


def test_the_pace_is_a_running_mean_of_the_seconds_between_steps():
    phase = Phase(H, P, follow=True)
    phase.stepped(1, 0.0)
    phase.stepped(3, 0.2)  # 0.1 s a step
    phase.stepped(3, 0.9)  # the same step again (a wait within it): no step
    phase.stepped(4, 1.1)  # 0.2 s

    assert phase.step_s == pytest.approx(0.8 * 0.1 + 0.2 * 0.2)


def test_an_island_keeps_the_pace_of_the_latest_within_a_step_in_a_period():
    assert in_pace(1.04, 1.0, inner_steps=20)
    assert in_pace(0.96, 1.0, inner_steps=20)
    assert not in_pace(1.1, 1.0, inner_steps=20)
    assert not in_pace(None, 1.0, inner_steps=20) and not in_pace(1.0, None, inner_steps=20)
