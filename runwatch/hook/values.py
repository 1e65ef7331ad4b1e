"""What ``run.log`` accepts: metric names and values, checked in the writer thread.

The training thread never pays for these checks; the writer calls them once per point (names
once per distinct name). NaN and Inf pass through untouched: a NaN loss is the most important
signal a run can send.
"""

from __future__ import annotations

import numbers
import re

MAX_NAME_LENGTH = 200
_BAD_NAME_CHARS = re.compile(r"[\x00-\x1f\x7f]")


class RefusedValue(ValueError):
    """A value that is not a number; ``kind`` names what it was, for the warning."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


class Refused:
    """A value already read and refused in the training process (``runwatch.hook.forward``
    sends this in its place): :func:`to_float` refuses it with the same ``kind``."""

    __slots__ = ("kind",)

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def __reduce__(self) -> tuple[type, tuple[str]]:
        return Refused, (self.kind,)


def name_problem(name: object) -> str | None:
    """Why ``name`` cannot be a metric name, or None when it can.

    >>> name_problem("train/loss") is None
    True
    >>> name_problem("")
    'is empty'
    >>> name_problem("a\\nb")
    'contains a control character'
    """
    if not isinstance(name, str):
        return f"is a {type(name).__name__}, not a str"
    if not name.strip():
        return "is empty"
    if len(name) > MAX_NAME_LENGTH:
        return f"is {len(name)} characters long (at most {MAX_NAME_LENGTH})"
    if _BAD_NAME_CHARS.search(name):
        return "contains a control character"
    return None


def to_float(value: object) -> float:
    """Coerce a loggable value to float, or raise :class:`RefusedValue` naming its kind.

    Accepts int, float, bool, NumPy scalars and 0-d arrays, and anything with ``.item()``
    holding one number (a 0-d or one-element torch tensor), without importing torch.

    >>> to_float(3), to_float(True), to_float(float("nan")) != to_float(float("nan"))
    (3.0, 1.0, True)
    >>> to_float("0.5")
    Traceback (most recent call last):
    ...
    runwatch.hook.values.RefusedValue: str
    """
    kind = type(value)
    if kind is float:
        return value  # type: ignore[return-value]
    if kind is int or kind is bool:
        return _int_to_float(value)  # type: ignore[arg-type]
    if kind is Refused:
        raise RefusedValue(value.kind)  # type: ignore[attr-defined]
    if isinstance(value, (str, bytes, bytearray)):
        raise RefusedValue(kind.__name__)
    if isinstance(value, numbers.Real):  # NumPy scalars, Fraction, Decimal-like
        try:
            return float(value)
        except (OverflowError, ValueError):
            raise RefusedValue(f"{kind.__name__} too large for a float") from None
    item = getattr(value, "item", None)
    if callable(item):
        size = _element_count(value)
        if size is not None and size != 1:
            raise RefusedValue(f"{kind.__name__} with {size} elements")
        try:
            inner = item()
        except (ValueError, RuntimeError, TypeError):
            raise RefusedValue(f"{kind.__name__} with more than one element") from None
        if inner is value or isinstance(inner, (str, bytes)):
            raise RefusedValue(kind.__name__)
        return to_float(inner)
    if value is None:
        raise RefusedValue("None")
    raise RefusedValue(kind.__name__)


def _int_to_float(value: int) -> float:
    try:
        return float(value)
    except OverflowError:
        raise RefusedValue("int too large for a float") from None


def _element_count(value: object) -> int | None:
    """Element count of an array-like (NumPy ``size``, torch ``numel()``), if it says."""
    numel = getattr(value, "numel", None)
    if callable(numel):
        try:
            return int(numel())
        except (TypeError, ValueError, RuntimeError):
            return None
    size = getattr(value, "size", None)
    if isinstance(size, int):
        return size
    return None
