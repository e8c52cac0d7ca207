"""Simulations say island for learner and mode for method, as the simulator now does:
rename those keys in the spec and the result of the rows already saved."""

from typing import Any

from django.db import migrations

# run_sweep's spec keys, and SimConfig's fields as the spec's base, the result's
# paper_setting and every row of the result's tables carry them.
SPEC_KEYS = {"learners": "islands", "knob_learners": "knob_islands"}
CONFIG_KEYS = {"method": "mode", "learners": "islands"}
TABLES = ("goodput_table", "knobs_table", "bandwidth_table")


def _renamed(data: Any, names: dict[str, str]) -> Any:
    """`data` with its keys renamed by `names`, in the same order; not a dict: as it is."""
    if not isinstance(data, dict):
        return data
    return {names.get(key, key): value for key, value in data.items()}


def _spec(spec: Any, spec_keys: dict[str, str], config_keys: dict[str, str]) -> Any:
    spec = _renamed(spec, spec_keys)
    if isinstance(spec, dict) and "base" in spec:
        spec["base"] = _renamed(spec["base"], config_keys)
    return spec


def _result(result: Any, spec_keys: dict[str, str], config_keys: dict[str, str]) -> Any:
    if not isinstance(result, dict):
        return result
    result = dict(result)
    if "spec" in result:
        result["spec"] = _spec(result["spec"], spec_keys, config_keys)
    if "paper_setting" in result:
        result["paper_setting"] = _renamed(result["paper_setting"], config_keys)
    for table in TABLES:
        if isinstance(result.get(table), list):
            result[table] = [_renamed(row, config_keys) for row in result[table]]
    return result


def _rename(apps, spec_keys: dict[str, str], config_keys: dict[str, str]) -> None:
    Simulation = apps.get_model("runs", "Simulation")
    for simulation in Simulation.objects.iterator():
        spec = _spec(simulation.spec, spec_keys, config_keys)
        result = _result(simulation.result, spec_keys, config_keys)
        if (spec, result) != (simulation.spec, simulation.result):
            simulation.spec, simulation.result = spec, result
            simulation.save(update_fields=["spec", "result"])


def forwards(apps, schema_editor) -> None:
    _rename(apps, SPEC_KEYS, CONFIG_KEYS)


def backwards(apps, schema_editor) -> None:
    _rename(apps, {new: old for old, new in SPEC_KEYS.items()},
            {new: old for old, new in CONFIG_KEYS.items()})


class Migration(migrations.Migration):
    dependencies = [("runs", "0006_run_stopping")]
    operations = [migrations.RunPython(forwards, backwards)]
