"""The data model's shared records (docs/architecture.md, "Contracts").

These small dataclasses are the contract between the hook, the store, the detectors and the
command line: every module that hands an event or an anomaly to another uses these, so a
field renamed here is renamed everywhere.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    import numpy as np

SEVERITIES: tuple[str, ...] = ("info", "warning", "critical")
"""Anomaly severities, lowest first; the index is the rank used by ``--fail-on``."""

EVENT_KINDS: tuple[str, ...] = (
    "start",
    "resume",
    "checkpoint",
    "crash",
    "hang",
    "restart",
    "xid",
    "oom",
    "nccl_timeout",
    "note",
    "finish",
    "log",
)
"""Event kinds the store accepts; ``log`` is a WARNING-or-worse record from LoggingHandler."""

FAILURE_EVENTS: dict[str, str] = {
    "crash": "critical",
    "oom": "critical",
    "nccl_timeout": "critical",
    "hang": "critical",
    "xid": "warning",
    "log": "warning",
}
"""Event kinds that are symptoms, with their severity; other events (checkpoints...) are not."""

RUN_STATUSES: tuple[str, ...] = ("running", "finished", "crashed", "stalled")

LABEL_KEYS: tuple[str, ...] = ("rank", "host", "gpu")
"""Series labels, as in Prometheus; a series is a metric name plus these."""

LR_METRICS: tuple[str, ...] = ("lr", "learning_rate")
"""The names a run's learning rate is read from when nothing says otherwise, first wins."""


def label_value(value: Any) -> Any:
    """A label value as series are keyed and stored: None for a missing one (None, NaN,
    ``pd.NA``), a plain int for an integral number (``3.0`` from a CSV column with gaps, a
    NumPy integer), anything else as it is.

    >>> [label_value(v) for v in (None, float("nan"), 3.0, 2, "h1")]
    [None, None, 3, 2, 'h1']
    """
    if value is None or type(value).__name__ == "NAType":
        return None
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()  # a NumPy scalar
    if isinstance(value, float):
        if math.isnan(value):
            return None
        if value.is_integer():
            return int(value)
    return value


def json_plain(value: Any) -> Any:
    """A JSON-safe scalar: NumPy scalars as plain numbers, NaN (a missing cell) as None.

    >>> json_plain(float("nan")), json_plain(2.5)
    (None, 2.5)
    """
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


class SeriesPoints(NamedTuple):
    """One series' points in a batch, in log order."""

    metric: str
    labels: dict[str, Any]
    steps: np.ndarray  # int64
    times: np.ndarray  # float64 Unix seconds (NaN when unknown)
    values: np.ndarray  # float64, NaN/Inf as logged


SeriesBatch = Sequence[SeriesPoints]
"""A flush from the hook's writer: every series that got points, each once."""


def severity_rank(severity: str) -> int:
    """Return the order of ``severity`` (info=0 < warning=1 < critical=2).

    >>> severity_rank("warning") > severity_rank("info")
    True
    """
    try:
        return SEVERITIES.index(severity)
    except ValueError:
        raise ValueError(
            f"unknown severity {severity!r}; valid values: {', '.join(SEVERITIES)}"
        ) from None


@dataclass(frozen=True, slots=True)
class Event:
    """Something that happened to the run at a step: a checkpoint, a crash, an XID, a note."""

    kind: str
    step: int | None
    time: float
    message: str = ""
    rank: int | None = None
    host: str | None = None
    attrs: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Anomaly:
    """An anomaly *episode*: it opens at ``start_step``, may grow, and closes.

    ``expected``/``lower``/``upper`` are None where the detector has no expectation.
    ``labels`` holds the series labels (rank, host, gpu) that apply.
    """

    detector: str
    metric: str
    start_step: int
    end_step: int
    severity: str
    score: float
    observed: float | None
    message: str
    labels: dict[str, Any] = field(default_factory=dict)
    expected: float | None = None
    lower: float | None = None
    upper: float | None = None
    is_open: bool = True
    details: dict[str, Any] = field(default_factory=dict)

    def to_json_dict(self, run: str) -> dict[str, Any]:
        """The ``runwatch analyze --format json`` object: a public contract
        (docs/architecture.md)."""
        return {
            "run": run,
            "detector": self.detector,
            "metric": self.metric,
            "labels": dict(self.labels),
            "start_step": self.start_step,
            "end_step": self.end_step,
            "severity": self.severity,
            "score": self.score,
            "observed": self.observed,
            "expected": self.expected,
            "lower": self.lower,
            "upper": self.upper,
            "message": self.message,
        }


INCIDENT_STATUSES: tuple[str, ...] = ("open", "benign", "real", "watch")
"""An incident is open until a person gives it a verdict (``runwatch verdict``, the inbox)."""


@dataclass(slots=True)
class Incident:
    """Anomalies and events believed to share one cause (``detect/incidents.py``).

    ``key`` is stable while the incident's first member stays its first, so a verdict given
    to it survives a re-analysis; ``members`` are ``("anomaly" | "event", row id)`` in step
    order, every one of them (the JSON output bounds what it prints, never what is kept).
    """

    key: str
    title: str
    severity: str
    first_step: int | None
    last_step: int | None
    count: int
    members: list[tuple[str, int]]
    signature: str | None = None
    is_active: bool = False
    hypotheses: list[dict[str, Any]] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
