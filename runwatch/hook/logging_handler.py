"""A ``logging.Handler`` that turns log records into points and events of a runwatch Run.

Many training scripts already log, and their fault lines (an NCCL watchdog timeout, a CUDA
OOM, an XID relayed from the kernel log) go only to a text file. With this handler attached:

- ``log.info("step", extra={"step": 100, "metrics": {"loss": 2.3}})`` becomes
  ``run.log({"loss": 2.3}, step=100)`` (the step is optional, as in ``run.log``);
- a record at or above ``event_level`` (WARNING by default) becomes an event: kind ``log``, or
  ``nccl_timeout`` / ``oom`` / ``xid`` when :func:`classify_log_message` recognises the line.

Like ``run.log``, it never raises into the caller: a failure goes to ``handleError`` (which
prints to stderr under ``logging.raiseExceptions``) and is counted. Records from runwatch's own
loggers are ignored, so a warning the writer logs about a record cannot loop back into it.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Mapping
from typing import Any, Protocol

from runwatch.log_patterns import classify_log_message

__all__ = ["LoggingHandler"]


class _RunLike(Protocol):
    def log(self, data: Mapping[str, Any], step: int | None = None) -> None: ...

    def event(
        self, kind: str, step: int | None = None, message: str = "", **attrs: Any
    ) -> None: ...


def _current_run() -> _RunLike | None:
    """The active Run, imported late: the handler module must not import the writer stack."""
    try:
        from runwatch.hook.run import current_run
    except ImportError:
        return None
    return current_run()


class LoggingHandler(logging.Handler):
    """Send log records to a Run: metrics in ``extra`` as points, warnings and worse as events.

    ``run=None`` means the run that is active when each record arrives (``runwatch.init``),
    so the handler can be attached before the run starts. ``dropped`` counts records that
    could not be delivered, by reason (``no_run``, ``bad_metrics``, ``error``).

    >>> class FakeRun:
    ...     def log(self, data, step=None): print("log", data, step)
    ...     def event(self, kind, step=None, message="", **attrs):
    ...         print("event", kind, step, message)
    >>> logger = logging.getLogger("train.doctest")
    >>> logger.addHandler(LoggingHandler(FakeRun()))
    >>> logger.warning("loss %s", "rising", extra={"step": 7, "metrics": {"loss": 3.5}})
    log {'loss': 3.5} 7
    event log 7 loss rising
    """

    def __init__(
        self,
        run: _RunLike | None = None,
        level: int = logging.NOTSET,
        event_level: int = logging.WARNING,
    ) -> None:
        super().__init__(level)
        self.run = run
        self.event_level = event_level
        self.dropped: Counter[str] = Counter()
        self._local = threading.local()

    def emit(self, record: logging.LogRecord) -> None:
        """Deliver one record; never raises (see the module docstring)."""
        if record.name == "runwatch" or record.name.startswith("runwatch."):
            return
        if getattr(self._local, "busy", False):
            return  # a Run that logs while we call it: do not recurse
        self._local.busy = True
        try:
            self._deliver(record)
        except Exception:
            self.dropped["error"] += 1
            self.handleError(record)
        finally:
            self._local.busy = False

    def _deliver(self, record: logging.LogRecord) -> None:
        metrics = getattr(record, "metrics", None)
        is_event = record.levelno >= self.event_level
        if metrics is None and not is_event:
            return
        run = self.run if self.run is not None else _current_run()
        if run is None:
            self.dropped["no_run"] += 1
            return
        step = getattr(record, "step", None)
        if metrics is not None:
            if isinstance(metrics, Mapping):
                run.log(metrics, step=step)
            else:
                self.dropped["bad_metrics"] += 1
        if is_event:
            message = record.getMessage()
            attrs: dict[str, Any] = {"level": record.levelname, "logger": record.name}
            text = message
            if record.exc_info and record.exc_info[1] is not None:
                exc = record.exc_info[1]
                attrs["exception"] = f"{type(exc).__name__}: {exc}"
                text = f"{message}\n{attrs['exception']}"
            kind, found = classify_log_message(text)
            run.event(kind, step=step, message=message, **{**attrs, **found})
