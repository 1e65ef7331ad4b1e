"""The wire format of ``/api/v1``: request and reply models, and the batch schema.

A batch is columnar (one object per series, with parallel arrays), because the cost of an
ingest server is per JSON token: ``{"metric":"loss","steps":[1,2,3],"values":[...]}`` carries a
series name and labels once per batch instead of once per point, and the arrays parse straight
into NumPy. Values may be JSON ``NaN``, ``Infinity`` and ``-Infinity`` (as Python's ``json``
writes them), because a NaN loss is a signal, not a gap.

Numbers are validated strictly, with two fixes found by schemathesis: a JSON
``true`` is never a number, and ``3.0`` is an integer (JSON Schema says so). Validation runs in
pydantic-core straight from the bytes (``validate_json``), without first building the Python
objects that ``json.loads`` would.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    TypeAdapter,
    WithJsonSchema,
    model_validator,
)

from runwatch.model import EVENT_KINDS, RUN_STATUSES
from runwatch.store.context import MAX_CONTEXT_KEYS, MAX_CONTEXT_TEXT

INT64_MAX = 2**63 - 1


def _integral(value: float) -> int:
    if not value.is_integer():
        raise ValueError("must be an integer")
    return int(value)


def _int(lo: int, hi: int) -> Any:
    """A JSON integer in [lo, hi]: never a bool or a string, but ``3.0`` is fine."""
    return Annotated[
        StrictInt | Annotated[StrictFloat, AfterValidator(_integral)],
        Field(union_mode="left_to_right"),
        AfterValidator(lambda v: _check_range(v, lo, hi)),
        WithJsonSchema({"type": "integer", "minimum": lo, "maximum": hi}),
    ]


def _check_range(value: int, lo: int, hi: int) -> int:
    if not lo <= value <= hi:
        raise ValueError(f"must be between {lo} and {hi}")
    return value


# Steps get the range check in Rust (Field ge/le), not in Python: they are the hot path.
Step = Annotated[
    Annotated[StrictInt, Field(ge=0, le=INT64_MAX)]
    | Annotated[StrictFloat, Field(ge=0, le=INT64_MAX), AfterValidator(_integral)],
    Field(union_mode="left_to_right"),
    WithJsonSchema({"type": "integer", "minimum": 0, "maximum": INT64_MAX}),
]
Number = Annotated[StrictFloat, WithJsonSchema({"type": "number"})]
OptStep = _int(0, INT64_MAX) | None
Rank = Annotated[_int(0, 2**31 - 1) | None, Field(default=None)]
Name = Annotated[
    StrictStr,
    Field(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f\x7f]*\S[^\x00-\x1f\x7f]*$"),
]
ClientId = Annotated[StrictStr, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._:-]+$")]
Host = Annotated[StrictStr | None, Field(default=None, max_length=255)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class Labels(_Model):
    """Series labels, as in Prometheus (rank, host, gpu)."""

    rank: Rank = None
    host: Host = None
    gpu: _int(0, 2**31 - 1) | Annotated[StrictStr, Field(max_length=128)] | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            k: v
            for k, v in (("rank", self.rank), ("host", self.host), ("gpu", self.gpu))
            if v is not None
        }


class SeriesIn(_Model):
    """One series' points in a batch: parallel arrays, in log order."""

    metric: Name
    labels: Labels = Field(default_factory=Labels)
    steps: list[Step]
    times: list[Number]
    values: list[Number]

    @model_validator(mode="after")
    def _same_lengths(self) -> SeriesIn:
        if not (len(self.steps) == len(self.times) == len(self.values)):
            raise ValueError(
                f"steps, times and values must have equal lengths (got {len(self.steps)}, "
                f"{len(self.times)}, {len(self.values)})"
            )
        return self


class EventIn(_Model):
    kind: Literal[EVENT_KINDS]  # type: ignore[valid-type]
    step: OptStep = None
    time: Number
    message: Annotated[StrictStr, Field(max_length=10_000)] = ""
    rank: Rank = None
    host: Host = None
    attrs: dict[str, Any] = Field(default_factory=dict)


ContextText = Annotated[StrictStr, Field(max_length=MAX_CONTEXT_TEXT)]
ContextValue = Annotated[
    StrictBool | StrictInt | Annotated[StrictFloat, Field(allow_inf_nan=False)] | ContextText,
    Field(union_mode="left_to_right"),
]


class ContextIn(_Model):
    """A change of a rank's step context: from ``step`` on, ``context`` (the whole of it) is
    in force (``runwatch.store.context``)."""

    step: _int(0, INT64_MAX)
    rank: Rank = None
    time: Number | None = None
    context: dict[Name, ContextValue] = Field(max_length=MAX_CONTEXT_KEYS)


class Batch(_Model):
    """One client batch. ``(client_id, seq)`` makes a retried or replayed batch count once:
    the server stores a batch only if ``seq`` is above the highest it stored for the client."""

    client_id: ClientId
    seq: _int(0, INT64_MAX)
    attempt: _int(1, 2**31 - 1)
    series: list[SeriesIn] = Field(default_factory=list)
    events: list[EventIn] = Field(default_factory=list)
    contexts: list[ContextIn] = Field(default_factory=list)


class RunStart(_Model):
    """Create, join or resume a run (see ``runwatch.store.ingest`` for the launch protocol)."""

    name: Name
    project: Annotated[StrictStr, Field(max_length=200)] | None = None
    config: dict[str, Any] = Field(default_factory=dict)
    resume: StrictBool | None = None
    client_id: ClientId | None = None
    launch_id: Annotated[StrictStr, Field(min_length=1, max_length=200)] | None = None
    world_size: Annotated[_int(1, 2**31 - 1) | None, Field(default=None)] = None
    rank: Rank = None
    host: Host = None
    reference: Name | None = Field(
        default=None,
        description="reference mode: the server's live detection judges each loss against "
        "this earlier run's curve in its store, aligned by step (404: no such run; 409: it "
        "cannot)",
    )
    family: Annotated[list[Name], Field(min_length=1, max_length=100)] | None = Field(
        default=None,
        description="family mode: the server's live detection judges each loss against "
        "what these earlier runs of the recipe in its store predict for this run (its "
        "config needs params and total_steps; 404: no such run; 409: it cannot)",
    )


class RunStarted(BaseModel):
    run_id: int
    attempt: int
    how: Literal["created", "joined", "new_attempt"]
    next_seq: int = Field(description="the first sequence number this client should use")


class AttemptIn(_Model):
    """A rank's step went back: ask for the next attempt after ``from_attempt``."""

    from_attempt: _int(1, 2**31 - 1)
    step: OptStep = None
    message: Annotated[StrictStr, Field(max_length=10_000)] = ""


class AttemptOut(BaseModel):
    attempt: int
    created: bool


class FinishIn(_Model):
    attempt: Annotated[_int(1, 2**31 - 1) | None, Field(default=None)] = None
    last_step: OptStep = None
    status: Literal[tuple(s for s in RUN_STATUSES if s != "running")] = "finished"  # type: ignore[valid-type]
    drops: dict[Annotated[StrictStr, Field(max_length=64)], _int(0, INT64_MAX)] = Field(
        default_factory=dict
    )
    rank: Rank = None
    host: Host = None


class FinishOut(BaseModel):
    run_id: int
    status: str


class BatchReply(BaseModel):
    batches: int
    stored: int = Field(description="batches stored now")
    duplicates: int = Field(description="batches already stored (a retry or replay)")
    points: int = Field(description="points stored now")


class RunOut(BaseModel):
    run_id: int
    name: str
    project: str | None
    status: str
    start_time: float
    end_time: float | None
    last_step: int | None
    attempts: int
    series: int
    points: int


class SeriesOut(BaseModel):
    series_id: int
    metric: str
    labels: dict[str, Any]
    points: int


JsonValue = float | Literal["NaN", "Infinity", "-Infinity"] | None


class PointsOut(BaseModel):
    """A series' live points (latest attempt wins); non-finite values as strings."""

    metric: str
    labels: dict[str, Any]
    steps: list[int]
    times: list[float | None]
    values: list[JsonValue]
    attempts: list[int]


class Health(BaseModel):
    status: Literal["ok"]
    queued_points: int


class ErrorOut(BaseModel):
    """Every 4xx/5xx reply: what went wrong and which field (``body`` for the whole body)."""

    error: str
    field: str | None = None
    detail: str = ""


BATCH = TypeAdapter(Batch)
BODY_MODELS: tuple[type[BaseModel], ...] = (Batch, RunStart, AttemptIn, FinishIn)
