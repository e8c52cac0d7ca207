"""Seeded fault schedules: which island breaks, how, when, and for how long.

The same schedule drives the real-system goodput benchmark in both modes, so
decoupled and elastic meet exactly the same faults. Faults arrive as a Poisson
process: each island fails on average once per `mtbf_s` seconds, so a run of M
islands sees one fault every mtbf_s / M seconds somewhere. An island that is
down is not hit again until it is back. Faults that take an island out (kill,
region outage, partition) end after a duration; kills and region outages are
then followed by an automatic rejoin.

Pure: plain values in, a list of Fault out; the caller carries them out.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

FAULT_KINDS = ("kill", "region_outage", "straggle", "partition", "degrade", "corrupt")
# Faults after which the island has to be rejoined (its process is gone).
REJOINED = ("kill", "region_outage")


@dataclass(frozen=True)
class ChaosPreset:
    """How often and how islands break.

    Args:
        mtbf_s: each island's mean time between failures, in seconds.
        mix: relative weight of each fault kind (kinds left out never happen).
        outage_s: mean duration of a fault; each lasts 0.5 to 1.5 times this.
        straggle_factor: how many times slower a straggling island runs.
        degrade_factor: by how much a degraded link's bandwidth is divided.
    """

    mtbf_s: float
    mix: dict[str, float] = field(default_factory=lambda: {"kill": 1.0})
    outage_s: float = 10.0
    straggle_factor: float = 4.0
    degrade_factor: float = 10.0

    def __post_init__(self) -> None:
        if not self.mtbf_s > 0:
            raise ValueError(f"mtbf_s must be positive, got {self.mtbf_s}")
        if not self.outage_s > 0:
            raise ValueError(f"outage_s must be positive, got {self.outage_s}")
        unknown = sorted(set(self.mix) - set(FAULT_KINDS))
        if unknown:
            raise ValueError(f"unknown fault kinds {unknown}; known: {', '.join(FAULT_KINDS)}")
        if not self.mix or min(self.mix.values()) < 0 or sum(self.mix.values()) <= 0:
            raise ValueError("mix needs at least one kind with a positive weight")


@dataclass(frozen=True)
class Fault:
    """One fault: at `at_s` seconds into the run, on `islands` (one, or a whole region)."""

    at_s: float
    kind: str
    islands: tuple[str, ...]
    duration_s: float
    factor: float | None = None

    @property
    def ends_s(self) -> float:
        return self.at_s + self.duration_s

    @property
    def rejoin(self) -> bool:
        """Whether the islands are rejoined when the fault ends."""
        return self.kind in REJOINED


PRESETS: dict[str, ChaosPreset] = {
    # On 4 islands: one fault about every 30 s somewhere, each out for about 10 s.
    "aggressive": ChaosPreset(mtbf_s=120.0, outage_s=10.0, mix={
        "kill": 0.5, "partition": 0.15, "straggle": 0.15, "region_outage": 0.05,
        "degrade": 0.1, "corrupt": 0.05}),
    "moderate": ChaosPreset(mtbf_s=480.0, outage_s=10.0, mix={
        "kill": 0.5, "partition": 0.2, "straggle": 0.2, "degrade": 0.1}),
    "kills_only": ChaosPreset(mtbf_s=120.0, outage_s=10.0, mix={"kill": 1.0}),
}


def schedule(preset: ChaosPreset, islands: dict[str, str], duration_s: float, seed: int
             ) -> list[Fault]:
    """The faults of one run, in time order; the same arguments give the same list.

    Args:
        preset: rates, kinds and durations.
        islands: island name -> region.
        duration_s: faults start within [0, duration_s).
        seed: seeds the schedule.
    """
    if not islands:
        raise ValueError("a schedule needs at least one island")
    if not duration_s > 0:
        raise ValueError(f"duration_s must be positive, got {duration_s}")
    rng = random.Random(seed)
    kinds = sorted(preset.mix)
    weights = [preset.mix[k] for k in kinds]
    names = sorted(islands)
    down_until = dict.fromkeys(names, 0.0)
    rate = len(names) / preset.mtbf_s
    faults: list[Fault] = []
    t = rng.expovariate(rate)
    while t < duration_s:
        up = [n for n in names if down_until[n] <= t]
        if up:
            kind = rng.choices(kinds, weights)[0]
            island = rng.choice(up)
            duration = preset.outage_s * rng.uniform(0.5, 1.5)
            hit = (island,)
            if kind == "region_outage":
                region = islands[island]
                hit = tuple(n for n in up if islands[n] == region)
            factor = {"straggle": preset.straggle_factor,
                      "degrade": preset.degrade_factor}.get(kind)
            faults.append(Fault(round(t, 3), kind, hit, round(duration, 3), factor))
            for name in hit:
                down_until[name] = t + duration
        t += rng.expovariate(rate)
    return faults
