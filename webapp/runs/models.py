"""Runs, their islands, checkpoints and events: the project's vocabulary as database rows."""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import models, transaction
from django.utils import timezone

from diloco.config import RunConfig
from diloco.config_parse import parse_config

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser
    from django.db.models import QuerySet

RUN_NAME_MAX_LENGTH = 100


def new_run_secret() -> str:
    """The key that signs this run's fragments (HMAC); never leaves the server."""
    return secrets.token_hex(32)


def _isoformat(value: Any) -> str | None:
    return value.isoformat() if value else None


class WrongState(ValueError):
    """What a run's (or an island's) state does not allow: the API answers it with 409."""


class RunQuerySet(models.QuerySet):
    """The runs in each named set of run states (Run.ADMITTED and the others)."""

    def admitted(self) -> RunQuerySet:
        return self.filter(state__in=Run.ADMITTED)

    def under_way(self) -> RunQuerySet:
        return self.filter(state__in=Run.UNDER_WAY)

    def running_or_paused(self) -> RunQuerySet:
        return self.filter(state__in=Run.RUNNING_OR_PAUSED)


class Run(models.Model):
    class Mode(models.TextChoices):
        DECOUPLED = "decoupled", "Decoupled DiLoCo"
        SYNC = "sync", "Synchronous DiLoCo"
        ELASTIC = "elastic", "Elastic data-parallel"

    class State(models.TextChoices):
        DRAFT = "draft"
        QUEUED = "queued"
        RUNNING = "running"
        PAUSED = "paused"
        STOPPING = "stopping"  # syncd merges what arrives, checkpoints, then: stopped
        COMPLETED = "completed"
        FAILED = "failed"
        STOPPED = "stopped"

    class StartProgress(models.TextChoices):
        """Where a start is (webapp/runs/starting.py): the request answered, the run waits
        for the control worker; its regions' pools fill; its islands are started; done."""
        NONE = "", "not started"
        QUEUED = "queued", "queued"
        FILLING_POOLS = "filling_pools", "filling pools"
        STARTING_ISLANDS = "starting_islands", "starting islands"
        STARTED = "started", "started"

    # The named sets of run states (docs/ARCHITECTURE.md, glossary), defined here alone.
    # Admitted: its memory counts against the hosts' (webapp.runs.validation.memory_misfits).
    ADMITTED = (State.QUEUED, State.RUNNING, State.PAUSED, State.STOPPING)
    # Under way: its page offers Stop. Final: no transition leaves it (TRANSITIONS).
    UNDER_WAY = (State.QUEUED, State.RUNNING, State.PAUSED)
    RUNNING_OR_PAUSED = (State.RUNNING, State.PAUSED)  # its islands can be killed, rejoined
    FINAL = (State.COMPLETED, State.FAILED, State.STOPPED)

    objects = RunQuerySet.as_manager()

    name = models.CharField(max_length=RUN_NAME_MAX_LENGTH)
    mode = models.CharField(max_length=16, choices=Mode.choices, default=Mode.DECOUPLED)
    config = models.JSONField(default=dict, help_text="The validated run config.")
    state = models.CharField(max_length=16, choices=State.choices, default=State.DRAFT)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, models.SET_NULL, null=True,
                                   blank=True, related_name="created_runs")
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    failure_reason = models.TextField(blank=True)
    start_progress = models.CharField(
        max_length=16, choices=StartProgress.choices, default=StartProgress.NONE, blank=True,
        help_text="Where the run's start is: queued, filling_pools, starting_islands, "
                  "started; empty for a draft.")
    secret = models.CharField(max_length=64, default=new_run_secret, editable=False)
    tokens = models.BigIntegerField(default=0, help_text="Tokens merged into the global model.")
    outer_steps = models.PositiveIntegerField(
        default=0, help_text="The smallest fragment version, kept current by syncd.")
    archived = models.BooleanField(default=False, help_text="Hidden from the runs list.")
    initial_checkpoint = models.ForeignKey(
        "Checkpoint", models.SET_NULL, null=True, blank=True, related_name="started_runs",
        help_text="The checkpoint the run's global model starts from; empty for a fresh model.")

    class Meta:
        ordering = ["-created_at", "-id"]
        permissions = [
            ("operate_run", "Can start, stop, pause, resume and checkpoint runs"),
            ("inject_fault", "Can inject faults into runs and rejoin islands"),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def is_under_way(self) -> bool:
        return self.state in Run.UNDER_WAY

    @property
    def is_running_or_paused(self) -> bool:
        return self.state in Run.RUNNING_OR_PAUSED

    def transition(self, to: str, *, by: AbstractBaseUser | None = None,
                   reason: str = "") -> None:
        """Move to state `to` if the state machine allows it, and record a run_state event.

        Args:
            to: the new state.
            by: the user who asked, or None for the system.
            reason: why; kept as failure_reason when the run fails.

        Raises:
            WrongState: when the run cannot go from its current state to `to`.
        """
        to = Run.State(to)
        with transaction.atomic():
            # Read the state under a row lock: two requests racing to move the same
            # run must not both pass the check against a stale copy.
            state, started_at = (Run.objects.select_for_update()
                                 .values_list("state", "started_at").get(pk=self.pk))
            current = Run.State(state)
            allowed = TRANSITIONS[current]
            if to not in allowed:
                hint = (f"from {current} a run can go to {', '.join(sorted(allowed))}"
                        if allowed else f"{current} is final")
                raise WrongState(f"cannot go from {current} to {to} ({hint})")
            now = timezone.now()
            changes: dict[str, Any] = {"state": to}
            if to == Run.State.RUNNING and started_at is None:
                changes["started_at"] = now
            if to in Run.FINAL:
                changes["finished_at"] = now
            if to == Run.State.FAILED:
                changes["failure_reason"] = reason
            Run.objects.filter(pk=self.pk).update(**changes)
            Event.objects.create(run=self, kind=Event.Kind.RUN_STATE, time=now, actor=by,
                                 detail={"from": current, "to": to, "reason": reason})
        for name, value in changes.items():
            setattr(self, name, value)

    def run_config(self) -> RunConfig:
        # The config was checked against settings.REGIONS when the run was created;
        # a region retired since must not make the stored run unreadable.
        regions = [island.get("region", "") for island in self.config.get("islands", [])]
        return parse_config(self.config, regions)

    def island_names(self) -> list[str]:
        """The names of the islands the run has now: those of its config, in its order.
        A removed island keeps its row (and its epochs) for when it comes back."""
        return [island["name"] for island in self.config.get("islands", [])]

    def current_islands(self) -> QuerySet[Island]:
        """The rows of the islands the run has now (island_names)."""
        return self.islands.filter(name__in=self.island_names())

    def get_island(self, island: Island | str) -> Island:
        """One of the islands the run has now, by row or by name.

        Raises:
            ValueError: when the run has no such island.
        """
        name = island.name if isinstance(island, Island) else island
        found = self.current_islands().filter(name=name).first()
        if found is None:
            names = ", ".join(self.current_islands().values_list("name", flat=True))
            raise ValueError(f"run {self.name!r} has no island named {name!r} (it has {names})")
        return found

    def require_state(self, states: tuple[str, ...], action: str) -> None:
        """Refuse `action` unless the run, read afresh, is in one of `states`.

        Raises:
            WrongState: when it is not.
        """
        self.refresh_from_db(fields=["state"])
        if self.state not in states:
            raise WrongState(f"cannot {action}: the run is {self.state} "
                             f"(it must be {' or '.join(states)})")

    def to_dict(self) -> dict[str, Any]:
        """The run as the API shows it; the secret is left out on purpose."""
        configured = set(self.island_names())
        return {
            "id": self.pk,
            "name": self.name,
            "mode": self.mode,
            "state": self.state,
            "config": self.config,
            "created_by": self.created_by.get_username() if self.created_by else None,
            "created_at": _isoformat(self.created_at),
            "started_at": _isoformat(self.started_at),
            "finished_at": _isoformat(self.finished_at),
            "failure_reason": self.failure_reason,
            "start_progress": self.start_progress,
            "tokens": self.tokens,
            "outer_steps": self.outer_steps,
            "archived": self.archived,
            "initial_checkpoint": self.initial_checkpoint_id,
            # Not current_islands(): all() reads the islands a summary prefetched.
            "islands": [island.to_dict() for island in self.islands.all()
                        if island.name in configured],
        }


TRANSITIONS: dict[Run.State, frozenset[Run.State]] = {
    Run.State.DRAFT: frozenset({Run.State.QUEUED}),
    Run.State.QUEUED: frozenset({Run.State.RUNNING, Run.State.FAILED, Run.State.STOPPING}),
    Run.State.RUNNING: frozenset(
        {Run.State.PAUSED, Run.State.COMPLETED, Run.State.FAILED, Run.State.STOPPING}),
    Run.State.PAUSED: frozenset({Run.State.RUNNING, Run.State.FAILED, Run.State.STOPPING}),
    Run.State.STOPPING: frozenset({Run.State.STOPPED, Run.State.FAILED}),
    Run.State.COMPLETED: frozenset(),
    Run.State.FAILED: frozenset(),
    Run.State.STOPPED: frozenset(),
}


class Island(models.Model):
    class State(models.TextChoices):
        PENDING = "pending"
        STARTING = "starting"
        TRAINING = "training"
        LOST = "lost"
        REJOINING = "rejoining"
        STOPPED = "stopped"

    class Fault(models.TextChoices):
        NONE = "none"
        STRAGGLE = "straggle"
        PARTITION = "partition"
        DEGRADE = "degrade"
        CORRUPT = "corrupt"

    run = models.ForeignKey(Run, models.CASCADE, related_name="islands")
    name = models.CharField(max_length=64)
    region = models.CharField(max_length=64)
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    fault = models.CharField("active fault", max_length=16, choices=Fault.choices,
                             default=Fault.NONE)
    epoch = models.PositiveIntegerField(
        default=0, help_text="Epoch; syncd refuses updates from an older one.")
    speed = models.FloatField(default=1.0)
    batch_size = models.PositiveIntegerField(default=8)
    bandwidth_gbps = models.FloatField(default=2.0)
    latency_ms = models.FloatField(default=30.0)
    tokens = models.BigIntegerField(default=0)
    inner_steps = models.BigIntegerField(default=0)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(fields=["run", "name"], name="island_name_unique_per_run"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.region})"

    def record_event(self, kind: str, by: AbstractBaseUser | None, **detail: Any) -> Event:
        """An event of the island's run about the island, asked for by `by`."""
        return Event.objects.create(run_id=self.run_id, island=self, kind=kind, actor=by,
                                    detail={"island": self.name, **detail})

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "region": self.region,
            "state": self.state,
            "fault": self.fault,
            "epoch": self.epoch,
            "speed": self.speed,
            "batch_size": self.batch_size,
            "bandwidth_gbps": self.bandwidth_gbps,
            "latency_ms": self.latency_ms,
            "tokens": self.tokens,
            "inner_steps": self.inner_steps,
        }


class Checkpoint(models.Model):
    # A checkpoint another run started from outlives its own run (run becomes empty).
    run = models.ForeignKey(Run, models.SET_NULL, null=True, blank=True,
                            related_name="checkpoints")
    # JSON object keys are strings: {"0": 12, "1": 11} is fragment 0 at version 12.
    versions = models.JSONField(default=dict, help_text="Fragment index -> global version.")
    outer_step = models.PositiveIntegerField(help_text="The smallest fragment version.")
    path = models.CharField(max_length=500)
    sha256 = models.CharField(max_length=64)
    bytes = models.BigIntegerField()
    eval_loss = models.FloatField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["created_at", "id"]
        get_latest_by = "created_at"

    def __str__(self) -> str:
        return f"{self.run} at outer step {self.outer_step}"


class Event(models.Model):
    class Kind(models.TextChoices):
        RUN_STATE = "run_state"
        MERGE = "merge"
        REJECTION = "rejection"
        ISLAND_LOST = "island_lost"
        ISLAND_REVIVED = "island_revived"
        REJOIN = "rejoin"
        FAULT = "fault"
        ROLLBACK = "rollback"
        CHECKPOINT = "checkpoint"
        ALERT = "alert"

    run = models.ForeignKey(Run, models.CASCADE, related_name="events")
    island = models.ForeignKey(Island, models.SET_NULL, null=True, blank=True,
                               related_name="events")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    time = models.DateTimeField(default=timezone.now, db_index=True)
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, models.SET_NULL, null=True, blank=True,
                              related_name="+", help_text="Who asked; empty for the system.")
    detail = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["time", "id"]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} at {self.time:%Y-%m-%d %H:%M:%S}"

    def to_dict(self, island_names: dict[int, str] | None = None) -> dict[str, Any]:
        """The event as the API and the live page show it; `island_names` (id -> name)
        saves a query per event when many are listed."""
        if island_names is not None:
            island = island_names.get(self.island_id) if self.island_id else None
        else:
            island = self.island.name if self.island_id else None
        return {"id": self.pk, "kind": self.kind, "time": _isoformat(self.time),
                "island": island, "actor": self.actor.get_username() if self.actor else None,
                "detail": self.detail}


class Metric(models.Model):
    """One point of a run's history, written by syncd from its status every few seconds:
    the charts of the control room and GET /api/runs/<id>/metrics read these."""

    run = models.ForeignKey(Run, models.CASCADE, related_name="metrics")
    time = models.DateTimeField(default=timezone.now, db_index=True)
    tokens = models.BigIntegerField(help_text="Tokens merged into the global model.")
    outer_steps = models.PositiveIntegerField(help_text="The smallest fragment version.")
    versions = models.JSONField(default=list, help_text="Global version per fragment.")
    goodput = models.FloatField(null=True, blank=True)
    uptime = models.FloatField(null=True, blank=True)
    train_loss = models.FloatField(null=True, blank=True)
    eval_loss = models.FloatField(null=True, blank=True)
    eval_tokens = models.BigIntegerField(
        null=True, blank=True, help_text="Tokens merged into the model eval_loss is of.")
    eval_bpb = models.FloatField(null=True, blank=True,
                                 help_text="eval_loss in bits per byte of the held-out text.")
    alive_islands = models.PositiveIntegerField(default=0)
    islands = models.JSONField(default=dict, blank=True,
                               help_text="Island -> state, tokens_per_s, bytes_up, bytes_down.")

    class Meta:
        ordering = ["time", "id"]

    def __str__(self) -> str:
        return f"{self.run} at {self.time:%H:%M:%S}"

    def to_dict(self) -> dict[str, Any]:
        return {"time": _isoformat(self.time), "tokens": self.tokens,
                "outer_steps": self.outer_steps, "versions": self.versions,
                "goodput": self.goodput, "uptime": self.uptime,
                "train_loss": self.train_loss, "eval_loss": self.eval_loss,
                "eval_tokens": self.eval_tokens, "eval_bpb": self.eval_bpb,
                "alive_islands": self.alive_islands, "islands": self.islands}


class Simulation(models.Model):
    """A sweep of the datacenter simulator (diloco/simsweep.py), run as a Celery task on
    the control queue; the Simulate page shows its progress and its tables."""

    class State(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        COMPLETED = "completed"
        FAILED = "failed"

    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, models.SET_NULL, null=True,
                                   blank=True, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)
    spec = models.JSONField(default=dict, help_text="The sweep: run_sweep's spec.")
    state = models.CharField(max_length=16, choices=State.choices, default=State.QUEUED)
    progress = models.FloatField(default=0.0, help_text="Share of the sweep's runs done.")
    result = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"simulation {self.pk} ({self.state})"

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.pk, "state": self.state, "progress": self.progress,
                "spec": self.spec, "result": self.result, "error": self.error,
                "created_at": _isoformat(self.created_at)}


# A model of this app kept in a module of its own; importing it registers it.
from webapp.runs.api_token import ApiToken  # noqa: E402, F401
