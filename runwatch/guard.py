"""The internal-error guard: a runwatch bug is logged once per site, counted, and never
reaches the training run.

Every place where runwatch does work on behalf of a run that must not fail because of it (a
thread's loop, a collector poll, a detector update, a webhook send, closing alerting) runs
inside a :class:`Guard`. The first error at a site is logged with its traceback; later ones
at DEBUG only, so a bug hit at every step does not flood the training log. Every error is
counted, per guard (``guard.count``) and per site for the whole process
(:func:`error_counts`, which ``run.stats()`` shows).

Blocks that turn a known failure into a specific result (retry a store write, refuse a bad
value with a drop reason, serve a stale cache) are not guards: they say what happens.

>>> import logging
>>> guard = Guard("doctest: dividing", logging.getLogger("runwatch.doctest"))
>>> with guard:
...     1 / 0
>>> guard.count
1
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

log = logging.getLogger("runwatch.guard")

_F = TypeVar("_F", bound=Callable[..., Any])
_lock = threading.Lock()
_totals: dict[str, int] = {}
_shared: dict[str, Guard] = {}


class Guard:
    """Catches ``Exception`` (never ``KeyboardInterrupt`` or ``SystemExit``), logs the first
    one with its traceback and counts all of them.

    Use it as a context manager (``with guard: ...``), as a decorator (the call returns None
    after an error), or call :meth:`report` from an ``except`` clause of a hot loop. It logs
    once per *instance*: keep one guard per site (an attribute, or :func:`internal_errors`),
    not a new one per call.

    Parameters
    ----------
    site : str
        What was being done, as the log words it ("polling the GPUs").
    logger : logging.Logger, optional
        Where the errors go (default ``runwatch.guard``); pass the owner's logger.
    level : int
        The level of the first message (default ERROR: it is a bug); later ones are DEBUG.
    """

    __slots__ = ("count", "level", "logger", "site")

    def __init__(
        self, site: str, logger: logging.Logger | None = None, level: int = logging.ERROR
    ) -> None:
        self.site = site
        self.logger = logger or log
        self.level = level
        self.count = 0

    def __enter__(self) -> Guard:
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        if exc is None or not isinstance(exc, Exception):
            return False
        self.report(exc)
        return True

    def __call__(self, func: _F) -> _F:
        @functools.wraps(func)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            with self:
                return func(*args, **kwargs)
            return None

        return guarded  # type: ignore[return-value]

    def report(self, exc: BaseException) -> None:
        """Count ``exc``; log it with its traceback if it is this guard's first."""
        with _lock:
            self.count += 1
            first = self.count == 1
            _totals[self.site] = _totals.get(self.site, 0) + 1
        if first:
            self.logger.log(
                self.level,
                "runwatch: internal error %s: %r; continuing (later errors here are "
                "counted and logged at DEBUG)",
                self.site,
                exc,
                exc_info=exc,
            )
        else:
            self.logger.debug("runwatch: internal error %s (#%d): %r", self.site, self.count, exc)


def internal_errors(site: str, logger: logging.Logger | None = None) -> Guard:
    """The process-wide guard for ``site``, made on first use (later ``logger`` arguments
    are ignored): ``with internal_errors("closing alerting"): ...``.

    Parameters
    ----------
    site : str
        What is being done, as the log words it.
    logger : logging.Logger, optional
        Where the errors go, fixed when the guard is made.
    """
    guard = _shared.get(site)
    if guard is None:
        with _lock:
            guard = _shared.setdefault(site, Guard(site, logger))
    return guard


def error_counts() -> dict[str, int]:
    """Internal errors caught in this process so far, by site."""
    with _lock:
        return dict(_totals)
