"""The simulator's configuration (diloco/simconfig.py): what it refuses, and why."""

import pytest

from diloco.simconfig import SimConfig


@pytest.mark.parametrize(("changes", "message"), [
    ({"mode": "dp", "islands": 2}, "islands must be 1"),
    ({"fragments": 200}, "fragments must be between 1 and inner_steps"),
    ({"min_quorum": 9}, "min_quorum must be between 1 and the number of islands"),
    ({"return_s": -1.0}, "return_s must be a finite number 0 or more"),
    ({"compression": "zip"}, "compression must be one of"),
    ({"overlap_steps": 100}, "overlap_steps must be at least 0 and below inner_steps"),
])
def test_it_rejects_bad_configs(changes, message):
    with pytest.raises(ValueError, match=message):
        SimConfig(**changes)
