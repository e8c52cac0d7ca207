"""Celery tasks of the trainer: thin glue around trainer.supervisor."""

from __future__ import annotations

from typing import Any

from celery import shared_task


@shared_task(name="trainer.run_island", acks_late=True)
def run_island(run_id: int, island: str, epoch: int, redis_url: str,
               asked_at: float | None = None) -> dict[str, Any]:
    """One incarnation of one island, on its region's queue, for as long as it trains;
    `asked_at` is when its start or rejoin was asked for (its dispatch phase)."""
    from django.conf import settings

    from trainer.supervisor import supervise_island

    result = supervise_island(run_id, island, epoch, redis_url, settings.LOG_DIR, asked_at)
    if result["ended"] == "failed":
        from webapp.runs.faults import record_island_failure

        record_island_failure(run_id, island, result)
    return result
