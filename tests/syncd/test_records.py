"""The records that cross layers (syncd.records): an island's heartbeat, read as
hostile input."""

import dataclasses
import json

import pytest

from syncd.records import MAX_COUNT, Heartbeat, HeartbeatError


def written(**fields: object) -> dict:
    """A heartbeat as an island writes it (every field), then `fields` in its place."""
    beat = dataclasses.asdict(Heartbeat.bare(3, 1000.0, 40, 1280, loss=2.5,
                                             phases={"pull": 0.5}, cpu_share=0.25))
    return json.loads(json.dumps({**beat, **fields}))


def test_a_heartbeat_reads_back_what_the_island_wrote():
    beat = Heartbeat.from_dict(written())

    assert beat == Heartbeat.bare(3, 1000.0, 40, 1280, loss=2.5, phases={"pull": 0.5},
                                  cpu_share=0.25)
    assert (beat.epoch, beat.step, beat.state, beat.phases) == (3, 40, "training", {"pull": 0.5})


@pytest.mark.parametrize(("field", "value"), [
    ("step", "40"), ("step", True), ("step", 1.5), ("step", -1), ("step", MAX_COUNT + 1),
    ("tokens", 10**30), ("epoch", None), ("time", "now"), ("time", 1e400), ("loss", -0.5),
    ("loss", [2.5]), ("pull_s", MAX_COUNT * 4.0), ("warm", 1), ("state", "dancing"),
    ("state", 3), ("idle_rss", 2.5), ("phases", [0.5]), ("phases", {"pull": "slow"}),
    ("phases", {"x" * 65: 1.0}), ("phases", {str(i): 1.0 for i in range(17)}),
])
def test_a_field_of_the_wrong_type_or_out_of_bounds_is_refused_by_name(field, value):
    with pytest.raises(HeartbeatError, match=rf"^{field}\b"):
        Heartbeat.from_dict(written(**{field: value}))


def test_a_missing_or_unknown_field_is_refused_by_name():
    beat = written()
    del beat["pid"]
    with pytest.raises(HeartbeatError, match=r"^pid: missing"):
        Heartbeat.from_dict(beat)
    with pytest.raises(HeartbeatError, match="'fuel': not a field"):
        Heartbeat.from_dict(written(fuel=1))


def test_what_is_not_an_object_is_no_heartbeat():
    with pytest.raises(HeartbeatError, match="is an object"):
        Heartbeat.from_dict([1, 2])


def test_a_refused_value_is_shown_cut_short():
    with pytest.raises(HeartbeatError) as refused:
        Heartbeat.from_dict(written(state="x" * 10_000))
    assert len(str(refused.value)) < 200


def test_optional_figures_may_be_unknown():
    beat = Heartbeat.from_dict(written(loss=None, phases=None, startup_s=None, cpu_share=None))

    assert (beat.loss, beat.phases, beat.startup_s, beat.cpu_share) == (None, None, None, None)
