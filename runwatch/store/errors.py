"""The store's exceptions: each message names the store file and what was wrong."""

from __future__ import annotations

from collections.abc import Sequence


class StoreError(RuntimeError):
    """A store could not be opened or used; the message says which file and why."""


class RunNotFoundError(StoreError, KeyError):
    """The named run is not in the store; carries the names that are."""

    def __init__(self, path: str, name: str, known: Sequence[str]) -> None:
        shown = ", ".join(known[:10]) + (" ..." if len(known) > 10 else "")
        hint = f"runs in it: {shown}" if known else "the store has no runs yet"
        super().__init__(f"{path}: no run named {name!r} ({hint})")
        self.name = name
        self.known = list(known)

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class RunExistsError(StoreError):
    """``resume=False`` was asked for a run name that already exists."""


class SchemaTooNewError(StoreError):
    """The store was written by a newer runwatch whose schema this one does not know."""

    def __init__(self, path: str, found: int, supported: int) -> None:
        super().__init__(
            f"{path}: store schema version {found} is newer than this runwatch understands "
            f"({supported}); upgrade runwatch to open it"
        )
        self.path = path
        self.found = found


class StoreUnavailableError(StoreError):
    """The database cannot be reached (down, restarting, network): retry later, not a bug."""
