"""Runs, their islands, checkpoints and events: the project's vocabulary as database rows."""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import models, transaction
from django.utils import timezone

from trainer.config import RunConfig, parse_config

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser

RUN_NAME_MAX_LENGTH = 100


def new_run_secret() -> str:
    """The key that signs this run's fragments (HMAC); never leaves the server."""
    return secrets.token_hex(32)


def _isoformat(value: Any) -> str | None:
    return value.isoformat() if value else None


class Run(models.Model):
    class Mode(models.TextChoices):
        DECOUPLED = "decoupled", "Decoupled DiLoCo"
        ELASTIC = "elastic", "Elastic data-parallel"

    class State(models.TextChoices):
        DRAFT = "draft"
        QUEUED = "queued"
        RUNNING = "running"
        PAUSED = "paused"
        COMPLETED = "completed"
        FAILED = "failed"
        STOPPED = "stopped"

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
    secret = models.CharField(max_length=64, default=new_run_secret, editable=False)
    tokens = models.BigIntegerField(default=0, help_text="Tokens merged into the global model.")

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return self.name

    def transition(self, to: str, *, by: AbstractBaseUser | None = None,
                   reason: str = "") -> None:
        """Move to state `to` if the state machine allows it, and record a run_state event.

        Args:
            to: the new state.
            by: the user who asked, or None for the system.
            reason: why; kept as failure_reason when the run fails.

        Raises:
            ValueError: when the run cannot go from its current state to `to`.
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
                raise ValueError(f"cannot go from {current} to {to} ({hint})")
            now = timezone.now()
            changes: dict[str, Any] = {"state": to}
            if to == Run.State.RUNNING and started_at is None:
                changes["started_at"] = now
            if to in FINAL_STATES:
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

    def to_dict(self) -> dict[str, Any]:
        """The run as the API shows it; the secret is left out on purpose."""
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
            "tokens": self.tokens,
            "islands": [island.to_dict() for island in self.islands.all()],
        }


TRANSITIONS: dict[Run.State, frozenset[Run.State]] = {
    Run.State.DRAFT: frozenset({Run.State.QUEUED}),
    Run.State.QUEUED: frozenset({Run.State.RUNNING, Run.State.FAILED, Run.State.STOPPED}),
    Run.State.RUNNING: frozenset(
        {Run.State.PAUSED, Run.State.COMPLETED, Run.State.FAILED, Run.State.STOPPED}),
    Run.State.PAUSED: frozenset({Run.State.RUNNING, Run.State.FAILED, Run.State.STOPPED}),
    Run.State.COMPLETED: frozenset(),
    Run.State.FAILED: frozenset(),
    Run.State.STOPPED: frozenset(),
}
FINAL_STATES = frozenset(state for state, allowed in TRANSITIONS.items() if not allowed)


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
        default=0, help_text="Incarnation; syncd refuses updates from an older one.")
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
    run = models.ForeignKey(Run, models.CASCADE, related_name="checkpoints")
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
