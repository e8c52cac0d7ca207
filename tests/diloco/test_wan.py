"""The emulated wide-area link's one formula (diloco/wan.py)."""

import pytest

from diloco.wan import transfer_time


def test_an_empty_message_takes_the_latency_alone():
    assert transfer_time(0, bandwidth_gbps=1.0, latency_ms=40) == pytest.approx(0.040)


def test_the_bytes_go_at_the_bandwidth_in_bits_after_the_latency():
    # 125 MB is 1 Gbit: one second at 1 Gbps, a tenth of one at 10 Gbps
    assert transfer_time(125_000_000, bandwidth_gbps=1.0, latency_ms=0) == pytest.approx(1.0)
    assert transfer_time(125_000_000, bandwidth_gbps=10.0, latency_ms=0) == pytest.approx(0.1)
    assert transfer_time(125_000_000, bandwidth_gbps=1.0, latency_ms=250) == pytest.approx(1.25)


def test_bytes_scale_sends_the_message_as_if_it_were_that_many_times_larger():
    plain = transfer_time(1_000_000, bandwidth_gbps=0.5, latency_ms=30)
    scaled = transfer_time(1_000_000, bandwidth_gbps=0.5, latency_ms=30, bytes_scale=100)

    assert scaled - 0.030 == pytest.approx(100 * (plain - 0.030))
    assert scaled == pytest.approx(transfer_time(100_000_000, bandwidth_gbps=0.5, latency_ms=30))
