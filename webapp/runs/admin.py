"""Admin pages for looking at runs; runs are created through the dashboard or the API,
and move between states only through Run.transition, so those fields are read-only here.
A run deleted here, alone or selected with others, is deleted by the service
(webapp.runs.lifecycle.delete_run), with its checks, its checkpoint files and its
Redis keys.
"""

from django.contrib import admin, messages
from django.contrib.admin.actions import delete_selected as django_delete_selected
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse

from webapp.runs.lifecycle import delete_run
from webapp.runs.models import Checkpoint, Event, Island, Run


class DeleteRefused(Exception):
    """The service would not delete a run; the message says which and why."""


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
    actions = ["delete_selected"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def delete_model(self, request: HttpRequest, obj: Run) -> None:
        try:
            delete_run(obj, request.user)
        except ValueError as e:
            raise DeleteRefused(f"{obj.name!r} was not deleted: {e}") from e

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Run]) -> None:
        """Each through the service; the first refusal raises DeleteRefused, and the
        transaction of delete_selected undoes the deletes before it."""
        for run in queryset:
            self.delete_model(request, run)

    def delete_view(self, request: HttpRequest, object_id: str,
                    extra_context: dict | None = None) -> HttpResponse:
        # Django's view runs in a transaction: a refusal rolls back its log entry too.
        try:
            return super().delete_view(request, object_id, extra_context)
        except DeleteRefused as e:
            self.message_user(request, str(e), messages.ERROR)
            return HttpResponseRedirect(reverse("admin:runs_run_change", args=[object_id]))

    @admin.action(permissions=["delete"],
                  description=django_delete_selected.short_description)
    def delete_selected(self, request: HttpRequest, queryset: QuerySet[Run]
                        ) -> HttpResponse | None:
        """Django's own bulk delete (its confirmation page, its log entries), whose
        deletes go through delete_queryset; a refusal deletes none of the selected."""
        try:
            with transaction.atomic():
                return django_delete_selected(self, request, queryset)
        except DeleteRefused as e:
            self.message_user(request, f"No run was deleted. {e}", messages.ERROR)
            return None


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
