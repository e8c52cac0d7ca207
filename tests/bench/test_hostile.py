"""The chaos soak's intruder (bench/hostile.py) against a RunSync on the tests' Redis:
what the soak's hostile invariants read is what syncd does with its entries."""

from __future__ import annotations

import pytest

from bench.hostile import Intruder
from syncd.connection import connect
from tests.syncd.runs import heartbeat_all, make_run_sync, send
from webapp.runs.models import Event

pytestmark = [pytest.mark.integration, pytest.mark.django_db]


def test_the_intruders_entries_are_quarantined_in_few_events_and_its_canaries_kept(
        redis_url, tmp_path):
    sync = make_run_sync(redis_url, tmp_path, "decoupled")
    heartbeat_all(sync)
    run_id = int(sync.store.run_id)
    intruder = Intruder(connect(redis_url), run_id, other_run_id=run_id + 1)
    batch = intruder.attack("a", 1, sync.store.globals.versions())
    intruder.watch()
    assert batch.quarantined_after_s is None, "still in the stream before syncd reads it"
    for island in ("a", "b"):
        send(sync, island, 0, 4)

    sync.tick()
    intruder.watch()

    assert batch.quarantined_after_s is not None and batch.canary_kept
    assert intruder.other_canary_kept()
    assert sync.store.globals.versions()[0] == 1
    assert sync.store.globals.handled(0) == {"a": 4, "b": 4}
    sync.recorder.flush()
    counts = [e.detail["quarantined"] for e in Event.objects.filter(run_id=run_id,
                                                                     kind="rejection")]
    assert sum(counts) == intruder.entries_written() == len(batch.stream_ids)
    assert 0 < len(counts) < len(batch.stream_ids)
