"""Celery queue names: one queue per region for islands, one for short jobs.

Import-light on purpose: the web app, the workers and the start command all
name queues through this module and nothing else.
"""

CONTROL_QUEUE = "control"
REGION_QUEUE_PREFIX = "region."


def region_queue(region: str) -> str:
    """The queue a region's worker consumes: every island of that region runs from it."""
    if not region:
        raise ValueError("region must be a non-empty name such as 'us-east', got ''")
    return REGION_QUEUE_PREFIX + region
