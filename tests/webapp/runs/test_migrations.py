"""Data migrations on rows saved before them, forwards and backwards."""

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

BEFORE = [("runs", "0006_run_stopping")]
AFTER = [("runs", "0007_simulation_islands_and_modes")]

# A simulation as the simulator saved it when it said learner and method.
OLD_SPEC = {"chips": [150000], "learners": [1, 8], "duration_s": 7200.0, "knobs": True}
OLD_RESULT = {
    "goodput_table": [{"method": "dp", "learners": 1, "chips": 150000, "goodput": 0.77}],
    "knobs_table": [{"knob": "paper", "method": "decoupled", "learners": 8, "chips": 150000,
                     "goodput": 0.94}],
    "bandwidth_table": [{"method": "streaming_int4", "bandwidth_gbps": 2.0,
                         "utilization": 1.0}],
    "spec": {"chips": [150000], "learners": [1, 8], "duration_s": 7200.0, "seed": 0,
             "base": {"method": "decoupled", "learners": 4}, "knob_chips": 150000,
             "knob_learners": 8, "knobs": True, "bandwidth_gbps": [2.0]},
    "paper_setting": {"method": "decoupled", "chips": 1200000, "learners": 8},
    "knobs": {"fragments": {"fragments": 16}},
    "archipelago": ["fragments"],
}
NEW_SPEC = {"chips": [150000], "islands": [1, 8], "duration_s": 7200.0, "knobs": True}
NEW_RESULT = {
    "goodput_table": [{"mode": "dp", "islands": 1, "chips": 150000, "goodput": 0.77}],
    "knobs_table": [{"knob": "paper", "mode": "decoupled", "islands": 8, "chips": 150000,
                     "goodput": 0.94}],
    "bandwidth_table": [{"mode": "streaming_int4", "bandwidth_gbps": 2.0,
                         "utilization": 1.0}],
    "spec": {"chips": [150000], "islands": [1, 8], "duration_s": 7200.0, "seed": 0,
             "base": {"mode": "decoupled", "islands": 4}, "knob_chips": 150000,
             "knob_islands": 8, "knobs": True, "bandwidth_gbps": [2.0]},
    "paper_setting": {"mode": "decoupled", "chips": 1200000, "islands": 8},
    "knobs": {"fragments": {"fragments": 16}},
    "archipelago": ["fragments"],
}


def _migrate(target):
    """Migrate the test database to `target`; the app registry of that state."""
    executor = MigrationExecutor(connection)
    executor.migrate(target)
    return executor.loader.project_state(target).apps


@pytest.mark.django_db(transaction=True)
def test_saved_simulations_say_island_and_mode_after_0007_and_learner_and_method_before():
    try:
        Simulation = _migrate(BEFORE).get_model("runs", "Simulation")
        done = Simulation.objects.create(spec=OLD_SPEC, result=OLD_RESULT).pk
        queued = Simulation.objects.create(spec=OLD_SPEC).pk

        Simulation = _migrate(AFTER).get_model("runs", "Simulation")
        after = {s.pk: (s.spec, s.result) for s in Simulation.objects.all()}
        Simulation = _migrate(BEFORE).get_model("runs", "Simulation")
        before = {s.pk: (s.spec, s.result) for s in Simulation.objects.all()}
    finally:
        _migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())

    assert after == {done: (NEW_SPEC, NEW_RESULT), queued: (NEW_SPEC, None)}
    assert before == {done: (OLD_SPEC, OLD_RESULT), queued: (OLD_SPEC, None)}
