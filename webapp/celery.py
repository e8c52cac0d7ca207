"""The Celery app: configured from the CELERY_* Django settings (webapp/settings.py).

Queues (trainer/queues.py): islands go to "region.<name>", each consumed by
that region's worker; short jobs go to "control", the default queue, with a
worker of its own. Commands to running islands never use a queue: they go
through Redis to the island's supervisor (docs/ARCHITECTURE.md, Processes).
"""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")

app = Celery("archipelago")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
