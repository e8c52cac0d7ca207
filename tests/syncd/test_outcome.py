"""A completed run's outcome (syncd/outcome.py): the figures its last status keeps, from
the run's accounting at the moment it ended."""

from types import SimpleNamespace

import pytest

from diloco.accounting import RunAccounting
from diloco.config_parse import parse_config
from syncd.outcome import finish

CONFIG = parse_config({
    "sync": {"inner_steps": 4, "fragments": 1, "min_quorum": 2},
    "islands": [{"name": "a", "region": "us-east"}, {"name": "b", "region": "us-east"}],
}, ["us-east"])


def trained(start: float = 100.0) -> RunAccounting:
    """Two islands of 1 s steps, each merged twice with 4 steps, from `start`."""
    accounting = RunAccounting(["a", "b"], start)
    for island in ("a", "b"):
        accounting.observe_step_time(island, 1.0, faulted=False, steps=4)
    for at in (start + 4.0, start + 8.0):
        accounting.merged_round({"a": 0.5, "b": 0.5}, {"a": 4, "b": 4}, at, fragment=0)
    return accounting


def test_the_outcome_ends_the_accounting_and_carries_its_figures():
    accounting = trained()

    spec = SimpleNamespace(config=CONFIG, elastic=False, barrier=False)
    outcome = finish(accounting, spec, 110.0,
                     tokens_merged=4096, eval_loss=2.5, versions=[2])

    assert accounting.clock.end == 110.0
    assert (outcome["start"], outcome["end"], outcome["wall_s"]) == (100.0, 110.0, 10.0)
    assert outcome["useful_s"] == pytest.approx(16.0)  # 8 steps of 1 s on each island
    assert outcome["allocated_s"] == pytest.approx(20.0)
    assert outcome["goodput"] == pytest.approx(0.8)
    assert outcome["merge_marks"] == [4.0, 8.0]
    assert outcome["step_time_s"] == {"a": 1.0, "b": 1.0}
    assert (outcome["tokens_merged"], outcome["eval_loss"], outcome["versions"]) == (
        4096, 2.5, [2])
    assert outcome["theta_s"] == pytest.approx(8.0)  # twice H = 4 steps of 1 s


def test_an_outcome_taken_again_keeps_the_first_end():
    accounting = trained()
    spec = SimpleNamespace(config=CONFIG, elastic=False, barrier=False)
    finish(accounting, spec, 110.0, tokens_merged=0, eval_loss=None, versions=[2])

    again = finish(accounting, spec, 150.0, tokens_merged=0, eval_loss=None, versions=[2])

    assert again["end"] == 110.0 and again["wall_s"] == 10.0
