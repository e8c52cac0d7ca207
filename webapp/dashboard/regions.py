"""Where regions sit on the control room's map, and the part of the world it shows.

The map is a Plotly geo subplot over the project's own copy of the world's shapes
(static/dashboard/topojson/). Known cloud regions have their real places; any
other region gets a free slot on a grid south of them.
"""

from __future__ import annotations

KNOWN: dict[str, tuple[float, float]] = {
    "us-east": (-77.5, 39.0), "us-central": (-93.6, 41.6), "us-west": (-121.2, 45.6),
    "us-south": (-96.8, 32.8), "europe-west": (4.5, 50.5), "europe-north": (24.9, 60.2),
    "asia-east": (121.0, 24.8), "asia-south": (72.9, 19.1),
}
# The least the map shows around its regions, in degrees, and its width : height.
MIN_SPAN = (50.0, 22.0)
ASPECT = 2.6


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


def map_view(positions: list[tuple[float, float]]) -> dict[str, list[float]]:
    """The longitude and latitude ranges that show every position with a margin, at
    least MIN_SPAN wide and high, widened to the map's ASPECT, inside the world."""
    lons = [lon for lon, _ in positions] or [0.0]
    lats = [lat for _, lat in positions] or [0.0]
    width = max(max(lons) - min(lons) + 20.0, MIN_SPAN[0])
    height = max(max(lats) - min(lats) + 14.0, MIN_SPAN[1])
    width, height = max(width, height * ASPECT), max(height, width / ASPECT)
    width, height = min(width, 360.0), min(height, 170.0)
    lon = _inside((min(lons) + max(lons)) / 2, width / 2, 180.0)
    lat = _inside((min(lats) + max(lats)) / 2, height / 2, 85.0)
    return {"lon": [lon - width / 2, lon + width / 2], "lat": [lat - height / 2, lat + height / 2]}


def _inside(centre: float, half: float, limit: float) -> float:
    """The centre moved so that centre ± half stays within ±limit."""
    return min(max(centre, -limit + half), limit - half)
