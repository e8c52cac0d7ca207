"""Where regions sit on the control room's map.

The map is drawn as a plain Plotly scatter on longitude and latitude axes, with
no base map: Plotly's geographic maps fetch their shapes from a CDN, and the
control room must render offline. Known cloud regions have their real places;
any other region gets a free slot on a grid south of them.
"""

from __future__ import annotations

KNOWN: dict[str, tuple[float, float]] = {
    "us-east": (-77.5, 39.0), "us-central": (-93.6, 41.6), "us-west": (-121.2, 45.6),
    "us-south": (-96.8, 32.8), "europe-west": (4.5, 50.5), "europe-north": (24.9, 60.2),
    "asia-east": (121.0, 24.8), "asia-south": (72.9, 19.1),
}


def region_positions(regions: list[str]) -> dict[str, tuple[float, float]]:
    """Region -> (longitude, latitude) for every region in `regions`."""
    positions = {}
    spare = 0
    for region in regions:
        if region in KNOWN:
            positions[region] = KNOWN[region]
        else:
            positions[region] = (-120.0 + 15.0 * (spare % 8), 20.0 - 6.0 * (spare // 8))
            spare += 1
    return positions
