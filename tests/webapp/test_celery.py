"""The Celery app (webapp.celery): configured from the CELERY_* settings, short jobs on
the control queue by default, the run tasks found."""

from trainer.queues import CONTROL_QUEUE
from webapp.celery import app


def test_the_app_takes_the_django_settings_and_sends_short_jobs_to_the_control_queue(
        settings):
    assert app.conf.task_default_queue == CONTROL_QUEUE == settings.CELERY_TASK_DEFAULT_QUEUE
    assert app.conf.task_acks_late is True and app.conf.accept_content == ["json"]


def test_the_run_tasks_are_registered():
    app.loader.import_default_modules()

    assert {"trainer.run_island", "runs.run_simulation"} <= set(app.tasks)
