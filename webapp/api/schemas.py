"""What the API takes and gives, as typed schemas: the OpenAPI document at
/api/openapi.json is made from these. What syncd's status says of a run and its
islands is described from its record (syncd/records.py, webapp/api/status_schema.py).

Request bodies refuse unknown fields. A run's config, and an island added to a run,
are described from the dataclasses of diloco/config.py (webapp/api/config_schema.py);
the values are taken as sent and checked by parse_config, which tells every problem at
once, keyed by dotted path.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal

from ninja import Field, Schema
from pydantic import (
    ConfigDict,
    PlainValidator,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from diloco.config import RUN_MODES
from syncd.records import ISLAND_STATES, IslandStatus, RunStatus
from webapp.api.config_schema import NOT_BLANK, island_in, run_config_in
from webapp.api.status_schema import from_record
from webapp.runs import reports
from webapp.runs.faults import FAULTS, MAX_FAULT_SECONDS, kinds_hitting
from webapp.runs.models import RUN_NAME_MAX_LENGTH, Event, Run
from webapp.runs.sampling import MAX_PROMPT_CHARS, MAX_SAMPLE_TOKENS


class Body(Schema):
    """A request body: a JSON object with only the declared fields."""

    model_config = ConfigDict(extra="forbid", strict=True)
    # Added to the message for an unknown field.
    unknown_hint: ClassVar[str] = ""


# -- the run config ------------------------------------------------------------------

IslandIn = island_in(Body)
RunConfigIn = run_config_in(Body, IslandIn)


def _json_object(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise PydanticCustomError("dict_type", "Input should be a valid dictionary")
    return value


# A run config: a JSON object the schema describes as RunConfigIn; parse_config checks it.
ConfigBody = Annotated[dict[str, Any],
                       PlainValidator(_json_object, json_schema_input_type=RunConfigIn)]


# -- runs ---------------------------------------------------------------------------

class RunIn(Body):
    unknown_hint: ClassVar[str] = "the run config goes under config"

    # Checked by create_run, beside the config, so that every problem is told at once:
    # the schema says what is right, and a body without them is told so with the rest.
    name: str = Field(description=f"1 to {RUN_NAME_MAX_LENGTH} characters, not blank "
                                  "(leading and trailing spaces are dropped).",
                      json_schema_extra={"minLength": 1, "maxLength": RUN_NAME_MAX_LENGTH,
                                         "pattern": NOT_BLANK})
    mode: str = Field(description="decoupled, sync (synchronous DiLoCo) or elastic (baseline).",
                      json_schema_extra={"enum": list(RUN_MODES)})
    config: ConfigBody = Field(
        default_factory=dict,
        description="The run config; missing fields take their defaults (GET "
                    "/api/config/schema: defaults and help).")
    initial_checkpoint: int | None = Field(
        None, ge=1, le=2**63 - 1,
        description="The id of a checkpoint the global model starts from.")

    @model_validator(mode="before")
    @classmethod
    def _told_with_the_config(cls, data: Any) -> Any:
        return {"name": "", "mode": "", **data} if isinstance(data, dict) else data


class RunPatch(Body):
    archived: bool = Field(description="Hide the run from the runs list, or show it again.")


class Open(Schema):
    """A schema that passes on the fields it does not declare."""

    model_config = ConfigDict(extra="allow")


class IslandBase(Open):
    name: str


# An island's row joined with syncd's status of it (webapp.runs.reports.run_summary).
IslandOut = from_record("IslandOut", IslandStatus, {
    **dict.fromkeys(("region", "state", "fault", "epoch", "tokens", "inner_steps",
                     "link"), ...),
    **reports.ISLAND_FIELDS}, base=IslandBase, doc="An island of a run.")


# The figures of syncd's latest status a run carries (None until syncd serves it).
RunFigures = from_record("RunFigures", RunStatus, dict.fromkeys(reports.RUN_FIELDS),
                         base=Open)


class RunOut(RunFigures):
    """A run with syncd's figures (None until syncd serves it)."""

    id: int
    name: str
    mode: Run.Mode
    state: Run.State
    config: dict[str, Any]
    created_by: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    failure_reason: str
    start_progress: Run.StartProgress = Field(description=(
        "Where the run's start is: queued (waiting for the control worker), filling_pools "
        "(waiting for warm standbys, at most ISLAND_POOL_FILL_WAIT_S), starting_islands, "
        "started; empty for a draft."))
    archived: bool
    initial_checkpoint: int | None
    islands: list[IslandOut]
    versions: dict[str, int] = Field(description="Fragment index -> global version.")
    outer_steps: int = Field(description="The smallest fragment version (global outer "
                                         "steps), kept current while the run trains.")
    tokens: int = Field(description="Tokens merged into the global model, kept current "
                                    "while the run trains (docs/FIGURES.md, progress).")
    progress: float = Field(description="Tokens merged against the token budget, 0 to 1.")


class RunList(Schema):
    count: int = Field(description="Runs that match, before limit and offset.")
    runs: list[RunOut]


class IslandList(Schema):
    islands: list[IslandOut]


class IslandLog(Schema):
    lines: list[str]


class ConfigSchema(Schema):
    defaults: dict[str, Any]
    help: dict[str, str] = Field(description="Dotted path -> what the field means.")
    modes: list[str]
    regions: list[str]


class EstimateIn(Body):
    config: ConfigBody = Field(
        default_factory=dict,
        description="A run config (as for POST /api/runs); missing fields take their "
                    "defaults.")


class NeedOut(Schema):
    total: int = Field(description="Bytes: the sum of the parts.")
    parts: dict[str, int] = Field(description="Bytes by what holds them.")


class WireOut(Schema):
    """One island's wire per outer step: one update of each fragment up
    (sync.compression), each fragment's newest version down (its difference with a
    lossy sync.downlink_compression, else the fp32 fragment)."""

    up_bytes: int = Field(description="Bytes sent up, wire headers left out.")
    down_bytes: int = Field(description="Bytes pulled down, wire headers left out.")
    up_s: float = Field(description="Seconds the island's link takes for them: each "
                                    "message its latency_ms, its bytes (times "
                                    "emulation.bytes_scale) at bandwidth_gbps.")
    down_s: float = Field(description="The same for the bytes pulled down.")


class EstimateOut(Schema):
    """diloco/sizes.py's estimate; docs/OPERATIONS.md, "Sizing a run", has the formulas."""

    params: int = Field(description="Parameters of the model.")
    model_bytes: int = Field(description="B: the model in float32.")
    redis: NeedOut
    syncd: NeedOut
    islands: dict[str, NeedOut] = Field(description="Island name -> its host's peak need "
                                                    "(every process), which admission uses.")
    expected: dict[str, NeedOut] = Field(description="Island name -> its host's expected "
                                                     "need: its typical high-water mark.")
    limits: dict[str, int] = Field(description="What the hosts declare, in bytes: "
                                               "redis_bytes (REDIS_MAXMEMORY_MB), "
                                               "syncd_host_bytes (SYNCD_HOST_MEMORY_MB) and "
                                               "island_host_bytes (ISLAND_HOST_MEMORY_MB).")
    taken: dict[str, Any] = Field(description="What the admitted runs (queued, running, "
                                              "paused, stopping) take: runs, redis_bytes, "
                                              "syncd_bytes, island_host_bytes (by region).")
    misfits: dict[str, list[str]] = Field(description="What does not fit, keyed as a "
                                                      "refusal of the run would be.")
    wire: dict[str, WireOut] = Field(description="Island name -> its wire bytes per outer "
                                                 "step and its link's seconds for them.")
    tradeoffs: list[dict[str, str]] = Field(description="What K, grace, alpha and tau cost: "
                                            "setting, value, speed, quality, source.")


# -- faults -------------------------------------------------------------------------

def _fault_kinds(schema: dict[str, Any]) -> None:
    """What each kind takes (FAULTS), as IslandFault's validators check it: an instant
    one neither duration_s nor factor, the others a duration_s (optional where it has a
    default) and a factor, within its range where it has one."""
    duration = {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_FAULT_SECONDS}
    null = {"type": "null"}
    kinds = []
    for kind in kinds_hitting("island"):
        rule = FAULTS[kind]
        if rule.duration == "none":
            kinds.append({"properties": {"kind": {"const": kind}, "duration_s": null,
                                         "factor": null}})
            continue
        factor: dict[str, Any] = {"type": "number"}
        if rule.factor_range:
            factor["minimum"], factor["maximum"] = rule.factor_range
        kinds.append({
            "properties": {"kind": {"const": kind},
                           "duration_s": {"anyOf": [duration, null]}
                           if rule.duration == "optional" else duration,
                           "factor": {"anyOf": [factor, null]}},
            **({} if rule.duration == "optional" else {"required": ["duration_s"]})})
    schema["oneOf"] = kinds


class IslandFault(Body):
    """kill ends the island's process at once (SIGKILL, mid-step); straggle, partition
    and degrade last duration_s seconds; corrupt poisons the island's next update."""

    model_config = ConfigDict(json_schema_extra=_fault_kinds)
    kind: Literal[kinds_hitting("island")]
    duration_s: float | None = Field(
        None, description=f"More than 0 and at most {MAX_FAULT_SECONDS}; not for kill; for "
                          f"corrupt the window for the next update (default "
                          f"{FAULTS['corrupt'].default_seconds:g}).",
        validate_default=True)
    factor: float | None = Field(
        None, description="; ".join(f"{kind}: {rule.factor} (default {rule.default_factor:g})"
                                    for kind, rule in FAULTS.items() if rule.factor),
        validate_default=True)

    @field_validator("duration_s")
    @classmethod
    def _duration(cls, value: float | None, info: ValidationInfo) -> float | None:
        kind = info.data.get("kind")
        rule = FAULTS.get(kind)
        if rule is not None and rule.duration == "none":
            if value is not None:
                raise ValueError(f"A {kind} is instant: leave duration_s out.")
            return None
        if value is None:
            if kind is None:
                return None
            if rule.duration == "optional":
                return rule.default_seconds
            raise ValueError(f"A {kind} fault needs duration_s, in seconds "
                             f"(more than 0, at most {MAX_FAULT_SECONDS}).")
        if not math.isfinite(value) or not 0 < value <= MAX_FAULT_SECONDS:
            raise ValueError(f"Must be more than 0 and at most {MAX_FAULT_SECONDS} seconds, "
                             f"got {value:g}.")
        return value

    @field_validator("factor")
    @classmethod
    def _factor(cls, value: float | None, info: ValidationInfo) -> float | None:
        kind = info.data.get("kind")
        if value is None or kind is None:
            return value
        rule = FAULTS[kind]
        if rule.factor is None:
            raise ValueError(f"A {kind} takes no factor.")
        if not math.isfinite(value):
            raise ValueError(f"Must be a finite number, got {value:g}.")
        if not rule.factor_fits(value):
            raise ValueError(f"The factor of {kind} must be {rule.factor_range_text()} "
                             f"({rule.factor}), got {value:g}.")
        return value


class RegionFault(Body):
    kind: Literal[kinds_hitting("region")] = Field(
        description="Every island of the run in the region is killed.")


class SystemFault(Body):
    kind: Literal[kinds_hitting("system")] = Field(
        description="SIGKILL to syncd; its supervisor starts it again. Every run stalls "
                    "until it is back.")


class FaultDone(Schema):
    kind: str
    islands: list[str] = Field(description="The islands it hit.")


# -- checkpoints, history ----------------------------------------------------------

class CheckpointOut(Schema):
    id: int = Field(description="The <n> of /checkpoints/<n>/download and /sample.")
    outer_step: int
    versions: dict[str, int]
    sha256: str
    bytes: int
    eval_loss: float | None
    created_at: datetime


class CheckpointList(Schema):
    checkpoints: list[CheckpointOut]


class SampleIn(Body):
    prompt: str = Field(description=f"The text to continue, 1 to {MAX_PROMPT_CHARS} characters.")
    tokens: int = Field(200, description=f"Bytes to generate, 1 to {MAX_SAMPLE_TOKENS}.")
    temperature: float = Field(0.8, description="Softmax temperature, above 0.")
    seed: int = Field(0, ge=0, le=2**63 - 1,
                      description="The sampling seed: the same seed, the same text.")


class SampleOut(Schema):
    text: str = Field(description="The continuation only.")


MetricFigures = from_record("MetricFigures", RunStatus, dict.fromkeys(
    ("outer_steps", "versions", "goodput", "uptime", "train_loss", "eval_loss",
     "eval_tokens", "eval_bpb", "alive_islands"), ...), base=Open)


class MetricOut(MetricFigures):
    """A point of the run's history: figures of a status of syncd's."""

    time: datetime
    tokens: int = Field(description="Tokens merged into the global model.")
    islands: dict[str, Any] = Field(description="Island -> its state, fault, tokens, "
                                                "tokens_per_s, bytes and goodput.")


class MetricList(Schema):
    metrics: list[MetricOut]


class EventOut(Schema):
    id: int
    kind: Event.Kind
    time: datetime
    island: str | None
    actor: str | None = Field(description="Who asked; None for the system.")
    detail: dict[str, Any]


class EventList(Schema):
    events: list[EventOut]


class Recovery(Schema):
    fault: str | None = Field(description="What caused the outage: kill or partition; "
                                           "None: the island went silent by itself.")
    seconds: dict[str, float | None] = Field(
        description="fault, lost, rejoin, first_step, first_merge -> seconds after the "
                    "fault (after the loss when no fault caused it); None: not yet.")
    phases: dict[str, Any] = Field(description="The rejoin's phases, as syncd records them.")


class StateSpan(Schema):
    state: str = Field(description=f"The island's state: {ISLAND_STATES} (or waiting, "
                                   "restarting in an elastic run).")
    start: float = Field(description="Seconds since the epoch.")
    end: float
    recovery: Recovery | None = Field(None, description="An outage's (lost, rejoining).")


class FaultSpan(Schema):
    fault: str = Field(description="straggle, partition, degrade or corrupt.")
    start: float
    end: float


class TimelineMark(Schema):
    kind: Literal["fault", "rejoin", "merge"]
    time: float
    label: str


class IslandTimeline(Schema):
    island: str
    spans: list[StateSpan]
    faults: list[FaultSpan]
    marks: list[TimelineMark] = Field(description="Its faults, rejoins and the merges "
                                                  "that took its update.")


class RunTimeline(Schema):
    start: float = Field(description="Seconds since the epoch.")
    end: float = Field(description="Now, or when the run ended.")
    since: float | None = Field(description="The `since` asked for: the lanes hold only "
                                            "what is from then on (spans cut there).")
    islands: list[IslandTimeline]


# -- tokens -------------------------------------------------------------------------

class TokenIn(Body):
    name: str = Field("", max_length=100, description="What the token is for.")


class TokenOut(Schema):
    id: int
    name: str
    hint: str = Field(description="The token's first characters.")
    created_at: datetime
    last_used_at: datetime | None


class NewToken(TokenOut):
    token: str = Field(description="Send it as Authorization: Bearer <token>. Shown once: "
                                   "only its hash is kept.")


class TokenList(Schema):
    tokens: list[TokenOut]


class Errors(Schema):
    errors: dict[str, list[str]] = Field(
        description="What was wrong, keyed by the config's dotted path or by body, auth, "
                    "permission, csrf, run, island, state...")


def answers(success: Any, *errors: int, body: bool = False) -> dict[int, Any]:
    """An endpoint's responses for the OpenAPI document: its success (a schema for 200, or
    {status: schema}) and the errors it may give besides 401, 403 and 422 (and 400 and
    413 for one that reads a body)."""
    ok = success if isinstance(success, dict) else {200: success}
    codes = {401, 403, 422, *errors, *((400, 413) if body else ())}
    return {**ok, **dict.fromkeys(sorted(codes), Errors)}
