"""runwatch: a training-run health monitor.

>>> import runwatch, tempfile, os
>>> path = os.path.join(tempfile.mkdtemp(), "doc.db")
>>> with runwatch.init(name="doc", store=path) as run:
...     run.log({"loss": 2.31, "grad_norm": 0.84, "lr": 3e-4}, step=100)
>>> runwatch.open_store(path).read_series("doc", "loss")["value"].tolist()
[2.31]
"""

from typing import Any

from runwatch.hook.run import Run, current_run, init, use_extras
from runwatch.store import open_store

__version__ = "0.1.0"


def _attach(**options: Any) -> Any:
    # Detection and alerting sit above the hook: imported when a run starts, not here.
    from runwatch.attach import attach

    return attach(**options)


use_extras(_attach)


def log(
    data: dict[str, Any], step: int | None = None, context: dict[str, Any] | None = None
) -> None:
    """``run.log`` on the current run (the one :func:`init` started last)."""
    run = current_run()
    if run is None:
        raise RuntimeError("runwatch.log() called before runwatch.init()")
    run.log(data, step=step, context=context)


def finish(timeout: float | None = None) -> None:
    """Finish the current run, if any."""
    run = current_run()
    if run is not None:
        run.finish(timeout)


def __getattr__(name: str) -> Any:
    # LoggingHandler is imported lazily so `import runwatch` stays light.
    if name == "LoggingHandler":
        from runwatch.hook.logging_handler import LoggingHandler

        return LoggingHandler
    raise AttributeError(f"module 'runwatch' has no attribute {name!r}")


__all__ = ["LoggingHandler", "Run", "finish", "init", "log", "open_store"]
