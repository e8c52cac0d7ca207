"""The emulated wide-area link: how long a message takes between an island and syncd.

One formula for the in-process cluster's virtual clock, syncd's grace window
(t_sync) and an island's emulated link, so that the three agree on what a
bandwidth and a latency mean.
"""

from __future__ import annotations


def transfer_time(nbytes: int, bandwidth_gbps: float, latency_ms: float,
                  bytes_scale: float = 1.0) -> float:
    """Seconds a message of `nbytes` takes one way: the latency, then its bytes, scaled
    by the run's emulation.bytes_scale (a small model sent as if it were a large one),
    at the bandwidth."""
    return latency_ms / 1000 + nbytes * bytes_scale * 8 / (bandwidth_gbps * 1e9)
