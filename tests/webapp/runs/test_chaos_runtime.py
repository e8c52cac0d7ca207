"""A run with a chaos schedule, in real processes: syncd kills an island through its
supervisor, records the fault, and rejoins it as a new epoch when the fault ends.

Every wait polls a condition with a deadline; none sleeps and hopes.
"""

from __future__ import annotations

import pytest
from test_runtime_processes import (  # noqa: F401 - fixtures
    runner_processes,
    start_and_wait,
    system,
    tiny_run,
)

from diloco.chaos import PRESETS, schedule
from tests.fixtures import wait_until
from webapp.runs.lifecycle import stop_run

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]
# kills_only, seed 139 on the test's three islands: island-2 dies 0.06 s into the
# schedule and is rejoined about 11 s later.
SEED = 139


def test_a_chaos_schedule_kills_an_island_records_the_fault_and_rejoins_it(
        system, corpus_file, redis_url):  # noqa: F811 - the system fixture
    islands = {f"island-{i}": "us-east" for i in range(3)}
    first = schedule(PRESETS["kills_only"], islands, 60.0, SEED)[0]
    assert (first.kind, first.islands, first.at_s < 1.0) == ("kill", ("island-2",), True)
    run = tiny_run(corpus_file, total_tokens=10**9)
    run.config["chaos"] = {"preset": "kills_only", "seed": SEED}
    run.save(update_fields=["config"])
    store = start_and_wait(run, redis_url, 1)

    fault = wait_until(lambda: run.events.filter(kind="fault", island__name="island-2",
                                                 detail__has_key="chaos").first(),
                       90, "the schedule's first fault")
    assert fault.actor is None
    assert fault.detail["fault"] == "kill"
    assert fault.detail["chaos"] == {"preset": "kills_only", "seed": SEED,
                                     "at_s": first.at_s}
    wait_until(lambda: not runner_processes(run, "island-2", 1), 30,
               "the supervisor to kill island-2's first epoch")
    wait_until(lambda: (b := store.signals.heartbeats().get("island-2")) is not None
               and b.epoch == 2 and b.state == "training", 90,
               "island-2's next epoch, started by the schedule, to train")
    assert run.events.filter(kind="rejoin", island__name="island-2").exists()
    assert store.epochs()["island-2"] == 2
    stop_run(run, by=None)
