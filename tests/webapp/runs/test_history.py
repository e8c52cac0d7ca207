"""Thinning a run's history (webapp/runs/history.py): the rule on plain rows, then on a
run's Metric rows in the database."""

from datetime import timedelta

import pytest
from django.utils import timezone

from webapp.runs.history import THIN_EVERY_S, thin_metrics, to_thin
from webapp.runs.lifecycle import create_run
from webapp.runs.models import Metric
from webapp.runs.records import DatabaseRecorder

NOW = 10_000_200.0  # a whole number of ten minutes


def test_the_last_hour_keeps_every_row():
    rows = [(i, NOW - 2 * i) for i in range(1800)]
    assert to_thin(rows, NOW) == []


def test_rows_older_than_an_hour_keep_one_a_minute_and_older_than_a_day_one_per_ten():
    hour_old = [(i, NOW - 7200 + 2 * i) for i in range(1800)]  # 2 to 1 h old, every 2 s
    day_old = [(10_000 + i, NOW - 2 * 86400 + 60 * i) for i in range(600)]  # a minute apart

    drop = set(to_thin(hour_old + day_old, NOW))

    assert len(hour_old) - len(drop & {i for i, _ in hour_old}) == 60
    assert len(day_old) - len(drop & {i for i, _ in day_old}) == 60
    assert to_thin([row for row in hour_old + day_old if row[0] not in drop], NOW) == []


@pytest.mark.django_db
def test_a_long_runs_recorder_thins_its_metric_rows_as_it_flushes():
    run = create_run(name="week", mode="decoupled", config={}, user=None)
    now = timezone.now()
    Metric.objects.bulk_create(Metric(run=run, time=now - timedelta(seconds=7200 - 2 * i),
                                      tokens=i, outer_steps=i) for i in range(3600))
    recorder = DatabaseRecorder(run.pk)
    recorder.next_thinning -= THIN_EVERY_S

    recorder.flush()

    # one a minute: 60 minutes, 61 where the hour does not begin on a whole minute
    assert 60 <= Metric.objects.filter(run=run, time__lt=now - timedelta(hours=1)).count() <= 61
    assert Metric.objects.filter(run=run, time__gt=now - timedelta(seconds=3500)).count() == 1749
    assert thin_metrics(run.pk, now) == 0
