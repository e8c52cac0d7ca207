"""Where regions sit on the run page's map and which part of the world it shows."""

import pytest

from webapp.dashboard.regions import ASPECT, KNOWN, MIN_SPAN, map_view, region_positions


def test_known_regions_have_their_places_and_others_get_free_slots():
    positions = region_positions(["us-east", "mars", "venus"])

    assert positions["us-east"] == KNOWN["us-east"]
    assert positions["mars"] != positions["venus"]


def test_the_view_shows_every_region_with_a_margin():
    places = [KNOWN["us-east"], KNOWN["us-west"], KNOWN["us-south"]]

    view = map_view(places)

    for lon, lat in places:
        assert view["lon"][0] + 5 < lon < view["lon"][1] - 5
        assert view["lat"][0] + 3 < lat < view["lat"][1] - 3


def test_one_region_is_shown_with_its_surroundings_at_the_maps_aspect():
    view = map_view([KNOWN["europe-west"]])

    width, height = view["lon"][1] - view["lon"][0], view["lat"][1] - view["lat"][0]
    assert width >= MIN_SPAN[0] and height >= MIN_SPAN[1]
    assert width / height == pytest.approx(ASPECT)


def test_regions_around_the_world_are_shown_whole_within_its_edges():
    view = map_view(list(KNOWN.values()))

    assert -180 <= view["lon"][0] < min(lon for lon, _ in KNOWN.values())
    assert max(lon for lon, _ in KNOWN.values()) < view["lon"][1] <= 180
    assert view["lat"][0] >= -85 and view["lat"][1] <= 85
