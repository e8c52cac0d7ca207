"""The Celery app: configured from the CELERY_* Django settings, tasks found per app."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")

app = Celery("archipelago")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
