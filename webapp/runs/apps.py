from django.apps import AppConfig
from django.db.models.signals import post_save


class RunsConfig(AppConfig):
    name = "webapp.runs"
    label = "runs"
    verbose_name = "Runs"

    def ready(self) -> None:
        from webapp.runs.live import on_event_saved
        from webapp.runs.models import Event

        post_save.connect(on_event_saved, sender=Event, dispatch_uid="push-events")
