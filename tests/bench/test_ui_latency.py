"""The UI latency benchmark's own arithmetic; the benchmark itself drives Daphne,
syncd and Chromium (`python -m bench ui_latency`), too heavy for the test tiers."""

import pytest

from bench.ui_latency import percentile


def test_percentiles_interpolate_between_ranks():
    values = [10.0, 20.0, 30.0, 40.0, 50.0]

    assert percentile(values, 50) == 30.0
    assert percentile(values, 95) == pytest.approx(48.0)
    assert percentile(values, 0) == 10.0 and percentile(values, 100) == 50.0


def test_the_order_of_the_samples_does_not_matter():
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0


def test_no_samples_is_an_error():
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)
