"""What a crash of syncd must not spoil: the outer step after a long absence, and the
database's record of the merges that were published but not yet written."""

import pytest
import torch

from syncd.merge import Update
from syncd.records import Recorder
from syncd.synchronizer import Synchronizer
from trainer.config import OptimConfig, SyncConfig
from trainer.fragments import partition
from webapp.runs.models import Event
from webapp.runs.services import create_run

PARAMS = {"w": torch.zeros(4)}


def test_a_round_carrying_many_rounds_of_tokens_steps_no_farther_than_a_whole_round():
    sync = Synchronizer(PARAMS, partition({"w": 4}, 1),
                        SyncConfig(min_quorum=1, max_staleness=4),
                        OptimConfig(outer_lr=0.5, outer_momentum=0.0), round_tokens=1024)
    # An island that kept sending while syncd was away: 50 rounds' worth in one merge.
    sync.submit(Update("a", 0, 50 * 1024, 200, {"w": torch.ones(4)}, 200), 0, now=0.0)

    sync.merge(0, now=1.0)

    assert torch.allclose(sync.globals[0]["w"], torch.full((4,), -0.5))


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_the_merges_a_killed_syncd_never_wrote_are_recorded_once_by_the_next():
    run = create_run(name="recovered", mode="decoupled", config={}, user=None)
    Event.objects.create(run=run, kind="merge", detail={"fragment": 0, "version": 1,
                                                        "tokens": 64, "weights": {"a": 1.0}})
    recorder = Recorder(run.pk)

    recovered = recorder.recover_merges({0: 3, 1: 2}, {0: 192, 1: 128})
    recorder.flush()

    assert recovered == [0, 1]
    merges = {e.detail["fragment"]: e.detail for e in run.events.filter(
        kind="merge", detail__reason="recovered")}
    assert merges[0] | {"weights": {}} == {"fragment": 0, "version": 3, "tokens": 128,
                                           "weights": {}, "reason": "recovered",
                                           "after_version": 1}
    assert merges[1]["version"] == 2 and merges[1]["tokens"] == 128
    assert Recorder(run.pk).recover_merges({0: 3, 1: 2}, {0: 192, 1: 128}) == []
