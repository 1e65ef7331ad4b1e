"""Reading a YAML document node by node, so every error names the file and the line.

``yaml.safe_load`` forgets where a value came from; ``yaml.compose`` keeps each node's
``start_mark``. The rules loader walks the composed tree with these helpers, and each check
that fails raises :class:`RulesError` carrying the path, the 1-based line and what would
have been valid.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import yaml

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


class RulesError(ValueError):
    """A rules file is invalid: ``path``, ``line`` (1-based, or None) and ``problem``."""

    def __init__(self, path: str, line: int | None, problem: str) -> None:
        where = f"{path}:{line}" if line is not None else path
        super().__init__(f"{where}: {problem}")
        self.path = path
        self.line = line
        self.problem = problem


def parse_duration(text: str) -> float:
    """Seconds in a Prometheus-style duration: ``0``, ``500ms``, ``30s``, ``5m``, ``1h30m``.

    >>> parse_duration("1h30m"), parse_duration("250ms"), parse_duration("0")
    (5400.0, 0.25, 0.0)
    """
    text = text.strip()
    if text == "0":
        return 0.0
    pos, total = 0, 0.0
    for match in _DURATION.finditer(text):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    if pos != len(text) or not text:
        raise ValueError(f"{text!r} is not a duration (like 0, 500ms, 30s, 5m, 4h, 1h30m, 1d)")
    return total


class Doc:
    """One composed YAML document and the path it came from."""

    def __init__(self, path: str, text: str) -> None:
        self.path = path
        try:
            self.root = yaml.compose(text, Loader=yaml.SafeLoader)
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            line = mark.line + 1 if mark is not None else None
            raise RulesError(path, line, f"not valid YAML: {exc.problem}") from None
        except yaml.YAMLError as exc:
            raise RulesError(path, None, f"not valid YAML: {exc}") from None
        self._loader = yaml.SafeLoader("")

    def error(self, node: yaml.Node | None, problem: str) -> RulesError:
        line = node.start_mark.line + 1 if node is not None else None
        return RulesError(self.path, line, problem)

    def mapping(
        self,
        node: yaml.Node,
        what: str,
        valid: Iterable[str] | None = None,
        required: Iterable[str] = (),
    ) -> dict[str, tuple[yaml.Node, yaml.Node]]:
        """A mapping's entries, key -> (key node, value node); unknown keys are errors."""
        if not isinstance(node, yaml.MappingNode):
            raise self.error(node, f"{what} must be a mapping")
        valid_keys = None if valid is None else list(valid)
        out: dict[str, tuple[yaml.Node, yaml.Node]] = {}
        for key_node, value_node in node.value:
            key = self.scalar(key_node)
            if not isinstance(key, str):
                raise self.error(key_node, f"{what}: keys must be strings, got {key!r}")
            if valid_keys is not None and key not in valid_keys:
                raise self.error(
                    key_node, f"{what}: unknown key {key!r}; valid keys: {', '.join(valid_keys)}"
                )
            if key in out:
                raise self.error(key_node, f"{what}: key {key!r} appears twice")
            out[key] = (key_node, value_node)
        for key in required:
            if key not in out:
                raise self.error(node, f"{what}: missing required key {key!r}")
        return out

    def sequence(self, node: yaml.Node, what: str) -> list[yaml.Node]:
        if not isinstance(node, yaml.SequenceNode):
            raise self.error(node, f"{what} must be a list")
        return list(node.value)

    def scalar(self, node: yaml.Node) -> Any:
        if not isinstance(node, yaml.ScalarNode):
            return node
        return self._loader.construct_object(node, deep=True)

    def string(self, node: yaml.Node, what: str) -> str:
        value = self.scalar(node)
        if not isinstance(value, str) or not value:
            raise self.error(node, f"{what} must be a non-empty string")
        return value

    def strings(self, node: yaml.Node, what: str) -> tuple[str, ...]:
        """A string or a list of strings (numbers are taken as their text, e.g. a rank)."""
        items = self.sequence(node, what) if isinstance(node, yaml.SequenceNode) else [node]
        out = []
        for item in items:
            value = self.scalar(item)
            if isinstance(value, bool) or not isinstance(value, (str, int)) or value == "":
                raise self.error(item, f"{what} must be a string or a list of strings")
            out.append(str(value))
        if not out:
            raise self.error(node, f"{what} must not be empty")
        return tuple(out)

    def choice(self, node: yaml.Node, what: str, valid: Iterable[str]) -> str:
        options = list(valid)
        value = self.scalar(node)
        if value not in options:
            raise self.error(
                node, f"{what}: {value!r} is not valid; valid values: {', '.join(options)}"
            )
        return str(value)

    def duration(self, node: yaml.Node, what: str) -> float:
        value = self.scalar(node)
        if isinstance(value, bool):
            raise self.error(node, f"{what} must be a duration like 30s, 5m or 4h")
        if isinstance(value, (int, float)):
            if value < 0:
                raise self.error(node, f"{what} must not be negative")
            return float(value)
        if not isinstance(value, str):
            raise self.error(node, f"{what} must be a duration like 30s, 5m or 4h")
        try:
            return parse_duration(value)
        except ValueError:
            raise self.error(
                node, f"{what}: {value!r} is not a duration; use e.g. 0, 500ms, 30s, 5m, 4h, 1d"
            ) from None

    def positive_int(self, node: yaml.Node, what: str) -> int:
        value = self.scalar(node)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise self.error(node, f"{what} must be a positive integer, got {value!r}")
        return value

    def boolean(self, node: yaml.Node, what: str) -> bool:
        value = self.scalar(node)
        if not isinstance(value, bool):
            raise self.error(node, f"{what} must be true or false, got {value!r}")
        return value
