"""How ``RunwatchCallback`` rides along a ``transformers.Trainer`` at no per-step cost.

HF's ``CallbackHandler`` calls every event of every callback it holds, seven keyword
arguments each time: a callback that does nothing already costs a few µs per step on cold
caches. So while ``train()`` runs, the callback leaves the handler's list
(:class:`OutOfDispatch`) and gets only the rare events it needs, through wrappers set on
the handler instance; it sees each log through HF's own ``state.log_history``
(:class:`MarkingHistory`). bench/README-integrations-hf.md has the measurements.
"""

from __future__ import annotations

import sys
from collections import deque
from functools import partial
from time import time
from typing import Any

from transformers.trainer_callback import CallbackHandler

RELAYED = (
    "on_train_begin",
    "on_step_begin",
    "on_evaluate",
    "on_save",
    "on_predict",
    "on_train_end",
)
"""The handler's events a detached callback still gets: the start and end of training (and a
second ``train()``), the first step (its timing window), and what pauses the steps."""


class MarkingHistory(list):
    """HF's ``state.log_history`` while a run is watched: ``Trainer.log`` appends each log
    entry to it, and the append also puts (entry, time) in ``marks`` for the run's writer.
    Copies HF makes (``dataclasses.asdict`` when it saves its state) have no marks."""

    def __init__(self, entries: Any = (), marks: deque[tuple[Any, ...]] | None = None):
        super().__init__(entries)
        self.marks = marks

    def append(self, entry: Any) -> None:
        list.append(self, entry)
        marks = self.marks
        if marks is not None:
            marks.append((entry, time()))


def calling_handler(callback: Any) -> CallbackHandler | None:
    """The ``CallbackHandler`` that is dispatching an event to ``callback`` now, found on
    the call stack (a callback is never given its handler), or None when the event came
    some other way (a direct call, a Trainer that dispatches differently)."""
    frame = sys._getframe(1)
    for _ in range(4):
        frame = frame.f_back
        if frame is None:
            return None
        handler = frame.f_locals.get("self")
        if isinstance(handler, CallbackHandler) and any(c is callback for c in handler.callbacks):
            return handler
    return None


class OutOfDispatch:
    """``callback`` taken out of ``handler``'s list until :meth:`restore`, the events in
    ``RELAYED`` relayed to it after HF's own dispatch of them.

    While out, ``trainer.callback_handler.callbacks`` does not list the callback. If
    ``train()`` raises, the callback stays out; the next ``train()``'s ``on_train_begin``
    puts it back in its place first, so HF dispatches that event to it as usual.
    """

    def __init__(self, handler: CallbackHandler, callback: Any):
        self.handler, self.callback = handler, callback
        self.place = next(i for i, c in enumerate(handler.callbacks) if c is callback)
        # A new list, not an edit: call_event may be iterating the old one right now.
        handler.callbacks = [c for c in handler.callbacks if c is not callback]
        for event in RELAYED:
            dispatch = getattr(handler, event)
            setattr(handler, event, partial(self._relay, event, dispatch))

    def _relay(self, event: str, dispatch: Any, args: Any, state: Any, control: Any, *more, **kw):
        if event == "on_train_begin":
            self.restore()
            return dispatch(args, state, control, *more, **kw)
        control = dispatch(args, state, control, *more, **kw)
        getattr(self.callback, event)(args, state, control)
        if event == "on_step_begin":  # only the first step's begin starts a window
            self.handler.__dict__.pop(event, None)
        return control

    def restore(self) -> None:
        """Put the callback back in its place and the handler's own events back."""
        for event in RELAYED:
            self.handler.__dict__.pop(event, None)
        callbacks = list(self.handler.callbacks)
        callbacks.insert(min(self.place, len(callbacks)), self.callback)
        self.handler.callbacks = callbacks
