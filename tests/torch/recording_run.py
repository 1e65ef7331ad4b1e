"""A stand-in for a ``Run`` in the timers' unit tests: the step they label from and the
``log_labeled`` calls they make, recorded (the timers' clocks are faked there too)."""

from __future__ import annotations


class RecordingRun:
    def __init__(self) -> None:
        self.step = 0
        self.logged: list[tuple[int, dict]] = []

    def log_labeled(self, data, labels, step=None):
        self.logged.append((step, dict(data)))
