"""Admin pages for looking at runs; runs are created through the dashboard or the API,
and move between states only through Run.transition, so those fields are read-only here.
"""

from django.contrib import admin
from django.http import HttpRequest

from webapp.runs.models import Checkpoint, Event, Island, Run


class IslandInline(admin.TabularInline):
    model = Island
    extra = 0
    can_delete = False
    fields = ["name", "region", "state", "fault", "epoch", "speed", "batch_size",
              "bandwidth_gbps", "latency_ms", "tokens", "inner_steps"]
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest, obj: Run | None = None) -> bool:
        return False


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = ["name", "mode", "state", "created_by", "created_at", "tokens"]
    list_filter = ["state", "mode"]
    search_fields = ["name"]
    # The secret is never shown: it is not editable, and not listed here.
    fields = ["name", "mode", "state", "config", "created_by", "created_at", "started_at",
              "finished_at", "failure_reason", "tokens"]
    readonly_fields = ["mode", "state", "config", "created_by", "created_at", "started_at",
                       "finished_at", "failure_reason", "tokens"]
    inlines = [IslandInline]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


class RecordAdmin(admin.ModelAdmin):
    """Checkpoints and events are records that syncd writes; the admin only shows them."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(Checkpoint)
class CheckpointAdmin(RecordAdmin):
    list_display = ["run", "outer_step", "created_at", "bytes", "eval_loss"]
    list_filter = ["run"]


@admin.register(Event)
class EventAdmin(RecordAdmin):
    list_display = ["time", "run", "island", "kind", "actor"]
    list_filter = ["kind", "run"]
    list_select_related = ["run", "island", "actor"]
