"""Thinning a run's history: a week-long run keeps its page fast and its database bounded.

syncd records a Metric row every 2 s (webapp.runs.records): 43,200 a day. Rows older
than an hour keep one a minute, and rows older than a day one every ten minutes
(TIERS): the first row of each such span is kept, the others deleted. Events are not
thinned: faults, merges and the rest are few and each is kept.

`to_thin` is the pure rule; `thin_metrics` applies it to the rows of one window of a
run's history (between WINDOW_S and an hour old), so each call reads a bounded number
of rows, whatever the run's age. syncd's recorder calls it every THIN_EVERY_S.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from webapp.runs.models import Metric

# (age in seconds, spacing in seconds): rows at least that old keep one per spacing.
TIERS = ((3600.0, 60.0), (86400.0, 600.0))
THIN_EVERY_S = 600.0
WINDOW_S = 26 * 3600.0  # rows older than this were thinned by earlier calls


def to_thin(rows: list[tuple[int, float]], now: float,
            tiers: tuple[tuple[float, float], ...] = TIERS) -> list[int]:
    """The ids of the rows ((id, unix time), any order) to delete at `now`: of the rows
    in one span of their tier's spacing, all but the earliest."""
    drop: list[int] = []
    kept: set[tuple[float, int]] = set()
    for row_id, at in sorted(rows, key=lambda row: (row[1], row[0])):
        spacing = max((space for age, space in tiers if now - at >= age), default=0.0)
        if not spacing:
            continue
        span = (spacing, int(at // spacing))
        if span in kept:
            drop.append(row_id)
        else:
            kept.add(span)
    return drop


def thin_metrics(run_id: int, now: datetime) -> int:
    """Thin the run's Metric rows between WINDOW_S and the first tier's age old; how many
    were deleted."""
    rows = Metric.objects.filter(run_id=run_id, time__gte=now - timedelta(seconds=WINDOW_S),
                                 time__lt=now - timedelta(seconds=TIERS[0][0]))
    drop = to_thin([(row_id, at.timestamp()) for row_id, at in rows.values_list("id", "time")],
                   now.timestamp())
    for first in range(0, len(drop), 1000):
        Metric.objects.filter(id__in=drop[first:first + 1000]).delete()
    return len(drop)
