"""Simulate: small sweeps of the datacenter simulator from the control room.

A sweep runs as a Celery task on the control queue (never a region's queue, which
is busy with islands); it writes its progress to its Simulation row as it goes,
at most a few times a second, and its tables when it is done.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from diloco.simsweep import run_sweep
from webapp.runs.live import send_to_group
from webapp.runs.models import Simulation

if TYPE_CHECKING:
    pass

# What the page may ask for: small enough to finish in a minute or two here.
MAX_CHIPS = 5_000_000
MAX_RUNS = 40
DEFAULT_SWEEP = {"chips": [150_000, 600_000, 1_200_000], "islands": [1, 4, 8],
                "duration_s": 2 * 3600.0, "knobs": True}
PROGRESS_EVERY_S = 0.25


def check_sweep(data: dict[str, Any]) -> dict[str, Any]:
    """The sweep the page asked for, checked: chips and islands lists, hours, knobs.

    Raises:
        ValueError: with every problem, one sentence each, keyed by field in .args[0].
    """
    errors: dict[str, str] = {}
    chips = _numbers(data.get("chips", DEFAULT_SWEEP["chips"]), int, 1000, MAX_CHIPS,
                     "chips", errors)
    islands = _numbers(data.get("islands", DEFAULT_SWEEP["islands"]), int, 1, 64,
                       "islands", errors)
    hours = _numbers([data.get("hours", DEFAULT_SWEEP["duration_s"] / 3600)], float, 0.1, 24,
                     "hours", errors)
    if chips and islands and len(chips) * (2 + len(islands)) > MAX_RUNS:
        errors["chips"] = (f"At most {MAX_RUNS} simulated runs per sweep here: "
                           f"{len(chips)} chip counts x {2 + len(islands)} runs each is too many.")
    if errors:
        raise ValueError(errors)
    return {"chips": chips, "islands": islands, "duration_s": hours[0] * 3600,
            "knobs": bool(data.get("knobs", True))}


def _numbers(value: Any, kind: type, lo: float, hi: float, name: str,
             errors: dict[str, str]) -> list[Any]:
    if isinstance(value, str):
        value = [v for v in value.replace(",", " ").split() if v]
    if not isinstance(value, list) or not value or len(value) > 10:
        errors[name] = "Give 1 to 10 numbers, separated by commas."
        return []
    out = []
    for v in value:
        try:
            number = kind(float(v))
        except (TypeError, ValueError, OverflowError):  # OverflowError: int("1e400")
            errors[name] = f"Must be numbers, got {v!r}."
            return []
        if not lo <= number <= hi:
            errors[name] = f"Each must be between {lo:g} and {hi:g}, got {number:g}."
            return []
        out.append(number)
    return sorted(set(out))


def run_simulation_now(simulation_id: int) -> None:
    """Run a queued sweep in this process, writing its progress and result to its row."""
    sweep = _save(simulation_id, state=Simulation.State.RUNNING).spec
    last = 0.0

    def progress(share: float) -> None:
        nonlocal last
        if share < 1 and time.monotonic() - last < PROGRESS_EVERY_S:
            return
        last = time.monotonic()
        _save(simulation_id, progress=share)

    try:
        result = run_sweep(sweep, progress)
    except Exception as e:
        _save(simulation_id, state=Simulation.State.FAILED, error=f"{type(e).__name__}: {e}")
        raise
    _save(simulation_id, state=Simulation.State.COMPLETED, progress=1.0, result=result)


def simulation_group(simulation_id: int) -> str:
    """The channel layer group of a simulation's page."""
    return f"simulation-{simulation_id}"


def _save(simulation_id: int, **fields: Any) -> Simulation:
    """Update the row, then tell the pages watching it (they show what the row says)."""
    simulation = Simulation.objects.get(pk=simulation_id)
    for name, value in fields.items():
        setattr(simulation, name, value)
    simulation.save(update_fields=list(fields))
    send_to_group(simulation_group(simulation_id), {
        "type": "simulation.update", "simulation": simulation.to_dict()})
    return simulation
