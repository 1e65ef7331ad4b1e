"""runwatch's process reading the ring the training process writes (``runwatch.hook._ring``):
``run.log``'s points and the items queued there, in the order they were logged.

A queued item arrives through the pipe, numbered by its mark; the ring is read up to the
first mark whose item has not arrived yet. What the writer has stored is handed back to
the ring (``keep``), so the training process may write over it and a child started again
after this one died reads from there.
"""

from __future__ import annotations

import collections
import mmap
from collections.abc import Callable
from typing import Any

from runwatch.hook._log_gate import points_in
from runwatch.hook._ring import RingReader


class RingFeed:
    """Reads ``fd``'s ring into a writer's queue.

    ``start``/``names``: where a restarted child begins, and the key names written before.
    Up to byte ``until`` (what the dead child had read) points at steps before
    ``stored_step`` are stored already and skipped, and at ``stored_step`` those of the
    metrics in ``stored_names`` (a later log at that step, an eval after a training log,
    may not be); so are marks up to ``skip_mark`` (items sent to the dead child, counted by
    the training process).
    """

    def __init__(
        self,
        fd: int,
        *,
        start: int | None = None,
        until: int = 0,
        names: list[str] | None = None,
        skip_mark: int = 0,
        stored_step: int | None = None,
        stored_names: frozenset[str] = frozenset(),
    ) -> None:
        self._reader = RingReader(mmap.mmap(fd, 0), start, names)
        self._until = until
        self._stored_step = stored_step
        self._stored_names = stored_names
        self._arrived: dict[int, Any] = {}  # queued items by mark, until the ring reaches them
        self._through = skip_mark  # every item marked up to here has arrived (or is skipped)
        self._ahead: set[int] = set()  # marks arrived beyond ``_through``
        self._taken_mark = skip_mark
        self.kept_mark = skip_mark
        """The last mark whose item the writer has stored (or that was skipped)."""
        # (the writer's rounds when the items were queued, ring position, last mark)
        self._taken: collections.deque[tuple[int, int, int]] = collections.deque()

    def arrived(self, items: list[Any], marks: list[int]) -> None:
        """Queued items from the pipe, with their marks."""
        self._arrived.update(zip(marks, items, strict=True))
        ahead = self._ahead
        ahead.update(marks)
        while self._through + 1 in ahead:
            self._through += 1
            ahead.remove(self._through)

    def last(self) -> None:
        """No more items will arrive (the training process finished or died): a mark
        still without its item is passed over."""
        self._through = 0xFFFF_FFFF_FFFF_FFFF

    def read(self, take: Callable[[list[Any], int], None], stop: int | None = None) -> None:
        """Hand what the ring holds (up to byte ``stop``), in order, to ``take(items,
        points)``, in batches."""
        reader = self._reader
        end = 0xFFFF_FFFF_FFFF_FFFF if stop is None else stop
        while True:
            resuming = reader.position < self._until
            records = reader.read(self._through, min(end, self._until) if resuming else end)
            if not records:
                return
            items: list[Any] = []
            for record in records:
                if type(record) is int:
                    item = self._arrived.pop(record, None)
                    self._taken_mark = record
                    if item is None:  # sent to a child that died, or not sendable
                        continue
                elif resuming:
                    item = self._not_stored(record)
                    if item is None:
                        continue
                else:
                    item = record
                items.append(item)
            if items:
                take(items, points_in(items))

    def _not_stored(self, record: tuple[int, float, dict[str, float]]) -> Any:
        """What of ``record``, read again after a restart, the store does not hold (None:
        all of it is stored)."""
        step, when, values = record
        stored = self._stored_step
        if stored is None or step > stored:
            return record
        if step < stored:
            return None
        left = {name: value for name, value in values.items() if name not in self._stored_names}
        return (step, when, left) if left else None

    def taken(self, rounds: int) -> None:
        """The writer had done ``rounds`` wake-ups when the last read's items reached it."""
        taken = (rounds, self._reader.position, self._taken_mark)
        if not self._taken or self._taken[-1][1:] != taken[1:]:
            self._taken.append(taken)

    def stored(self) -> None:
        """The writer has stored all it was given (a flush): hand it all back."""
        self._taken.clear()
        self.kept_mark = self._taken_mark
        self._reader.keep(self._reader.position)

    def keep(self, rounds: int) -> None:
        """The writer has done ``rounds`` wake-ups: hand back what it stored. Items queued
        before a wake-up began are written once the wake-up after it ends."""
        kept = None
        while self._taken and self._taken[0][0] + 2 <= rounds:
            kept = self._taken.popleft()
        if kept is not None:
            _, position, self.kept_mark = kept
            self._reader.keep(position)
