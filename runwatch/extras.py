"""Optional dependencies: which command needs which extra, and a clear error without it.

A training process installs ``runwatch`` alone: the hook, the store, detection, alerting and
the CLI. The web dashboard (Streamlit, Plotly) and the ingest server (FastAPI, uvicorn) are
extras, ``runwatch[dashboard]`` and ``runwatch[server]`` (``runwatch[all]`` has both). A
command that needs a missing one stops before doing anything, with one line that names the
extra, and exit code 2.
"""

from __future__ import annotations

import importlib.util

EXTRAS: dict[str, tuple[str, ...]] = {
    "dashboard": ("streamlit", "plotly"),
    "server": ("fastapi", "uvicorn"),
}
"""Extra -> the modules it provides (as imported), in ``pyproject.toml``'s order."""


class MissingExtra(ImportError):
    """A command needs an extra that is not installed; the message says how to install it."""


def missing(extra: str) -> list[str]:
    """The modules of ``extra`` that cannot be imported here (found without importing them).

    >>> missing("no such extra")
    Traceback (most recent call last):
    ...
    KeyError: "unknown extra 'no such extra'; known: dashboard, server"
    """
    if extra not in EXTRAS:
        raise KeyError(f"unknown extra {extra!r}; known: {', '.join(EXTRAS)}")
    return [name for name in EXTRAS[extra] if _find(name) is None]


def require(extra: str, command: str) -> None:
    """Raise :class:`MissingExtra` unless every module of ``extra`` is installed.

    Parameters
    ----------
    extra
        The extra's name in ``pyproject.toml`` (``dashboard``, ``server``).
    command
        The command that needs it, for the message (``dashboard``, ``demo``, ``serve``).
    """
    absent = missing(extra)
    if absent:
        raise MissingExtra(
            f"runwatch {command} needs the {extra} extra ({', '.join(absent)} not installed): "
            f"pip install 'runwatch[{extra}]'"
        )


def _find(name: str) -> object | None:
    try:
        return importlib.util.find_spec(name)
    except (ImportError, ValueError):  # a broken or half-removed install counts as missing
        return None
