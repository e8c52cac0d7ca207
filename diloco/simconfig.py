"""The settings of one simulated run of diloco/sim.py, checked as they are made."""

from __future__ import annotations

import math
from dataclasses import dataclass

from diloco.codecs import BLOCK
from diloco.config import WEIGHTINGS

YEAR_S = 365 * 86400.0
# The one calibrated knob: the pause to rebuild a job's or an island's mesh without or
# with a slice, fitted so that elastic data-parallel gives the paper's 58% at 1.2M
# chips (docs/BENCHMARKS.md; `diloco.simsweep.calibrate_reconfigure` refits it).
RECONFIGURE_S = 6.61
NO_STALENESS_BOUND = 10**9
SIM_MODES = ("dp", "elastic", "decoupled")
# Bytes on the wire per parameter for each codec of diloco/codecs.py
# (int8 and int4 carry one float32 scale per block).
BYTES_PER_PARAM = {"none": 4.0, "bf16": 2.0, "int8": 1.0 + 4 / BLOCK, "int4": 0.5 + 4 / BLOCK}


@dataclass(frozen=True)
class SimConfig:
    """One simulated run.

    Args:
        mode: "dp", "elastic" or "decoupled".
        chips: chips in the whole allocation.
        islands: M, islands the chips are split into evenly (1 for dp and elastic).
        mtbi_s: mean time between interruptions of one chip (math.inf: none).
        slice_chips: chips one interruption takes out (the failed chip's replica).
        return_s: time for an interrupted slice to come back.
        step_time_s: one inner step of an island.
        downscale_s: pause of an island (elastic: of the job) that drops a failed slice.
        upscale_s: pause of an island (elastic: of the job) that takes a slice back.
        restart_s: pause of a dp restart on spare hardware.
        checkpoint_steps: dp keeps an in-memory checkpoint every this many steps.
        inner_steps: H, inner steps between two sends of one fragment.
        fragments: P, fragments of the model; one is sent every H/P steps.
        overlap_steps: tau, steps an island trains after a send before it needs the merge.
        min_quorum: K, updates a fragment's round needs before it may merge.
        grace_gamma: scales the adaptive grace window after quorum (0: merge at quorum).
        max_staleness: updates based on a version older than newest minus this are dropped
            (the default, NO_STALENESS_BOUND, drops none: we found no cutoff in the paper).
        grace_round_trip: size the grace window with t_sync = uplink + downlink, as
            syncd/service.py's round_stats does; False passes the downlink alone (what
            round_stats passed before it counted the round trip).
        weighting: "tokens" or "uniform", as diloco.merge.
        model_params: parameters of the model.
        compression: codec of the fragments on the wide-area link, both ways.
        bandwidth_gbps: each island's wide-area link, per direction.
        latency_s: one-way latency of that link.
        duration_s: simulated wall time.
        seed: seeds the interruptions.
    """

    mode: str = "decoupled"
    chips: int = 1_200_000
    islands: int = 8
    mtbi_s: float = YEAR_S
    slice_chips: int = 256
    return_s: float = 3600.0
    step_time_s: float = 1.0
    downscale_s: float = RECONFIGURE_S
    upscale_s: float = RECONFIGURE_S
    restart_s: float = 60.0
    checkpoint_steps: int = 10
    inner_steps: int = 100
    fragments: int = 4
    overlap_steps: int = 5
    min_quorum: int = 1
    grace_gamma: float = 0.0
    max_staleness: int = NO_STALENESS_BOUND
    grace_round_trip: bool = False
    weighting: str = "tokens"
    model_params: float = 12e9
    compression: str = "int4"
    bandwidth_gbps: float = 5.0
    latency_s: float = 0.05
    duration_s: float = 86400.0
    seed: int = 0

    def __post_init__(self) -> None:
        _choice("mode", self.mode, SIM_MODES)
        _choice("weighting", self.weighting, WEIGHTINGS)
        _choice("compression", self.compression, tuple(BYTES_PER_PARAM))
        if self.mode != "decoupled" and self.islands != 1:
            raise ValueError(f"{self.mode} runs one job: islands must be 1, got {self.islands}")
        _at_least("islands", self.islands, 1)
        _at_least("chips", self.chips, self.islands)
        _at_least("slice_chips", self.slice_chips, 1)
        _at_least("checkpoint_steps", self.checkpoint_steps, 1)
        _at_least("inner_steps", self.inner_steps, 1)
        if not 1 <= self.fragments <= self.inner_steps:
            raise ValueError(f"fragments must be between 1 and inner_steps ({self.inner_steps}),"
                             f" got {self.fragments}")
        if not 0 <= self.overlap_steps < self.inner_steps:
            raise ValueError(f"overlap_steps must be at least 0 and below inner_steps "
                             f"({self.inner_steps}), got {self.overlap_steps}")
        if not 1 <= self.min_quorum <= self.islands:
            raise ValueError(f"min_quorum must be between 1 and the number of islands "
                             f"({self.islands}), got {self.min_quorum}")
        _at_least("max_staleness", self.max_staleness, 0)
        for name in ("mtbi_s", "step_time_s", "model_params", "bandwidth_gbps", "duration_s"):
            value = getattr(self, name)
            if not value > 0 or (math.isinf(value) and name != "mtbi_s"):
                raise ValueError(f"{name} must be a positive number, got {value}")
        for name in ("return_s", "downscale_s", "upscale_s", "restart_s", "latency_s",
                     "grace_gamma"):
            value = getattr(self, name)
            if not 0 <= value < math.inf:
                raise ValueError(f"{name} must be a finite number 0 or more, got {value}")

    @property
    def fragment_seconds(self) -> float:
        """Time to push one fragment through an island's link, latency left out."""
        bits = self.model_params * BYTES_PER_PARAM[self.compression] * 8 / self.fragments
        return bits / (self.bandwidth_gbps * 1e9)


def _choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}, got {value!r}")


def _at_least(name: str, value: int, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer {low} or more, got {value!r}")
