"""Celery queue names (trainer.queues): a queue per region, one for short jobs."""

import pytest

from trainer.queues import CONTROL_QUEUE, region_queue


def test_a_regions_islands_run_from_a_queue_named_for_it():
    assert region_queue("us-east") == "region.us-east"
    assert region_queue("eu-west") != region_queue("us-east")


def test_no_region_queue_is_the_control_queue():
    assert region_queue("control") != CONTROL_QUEUE


def test_a_region_without_a_name_has_no_queue():
    with pytest.raises(ValueError, match="region must be a non-empty name"):
        region_queue("")
