"""Load YAML configuration into typed specs, with errors that name the file and the line."""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from workloads.errors import InputError

SpecT = TypeVar("SpecT", bound=BaseModel)


def _line_index(node: yaml.Node, path: tuple = ()) -> dict[tuple, int]:
    """Map every key path of a composed YAML document to its 1-based line."""
    lines = {path: node.start_mark.line + 1}
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            child = path + (key.value,)
            lines[child] = key.start_mark.line + 1
            lines.update({k: v for k, v in _line_index(value, child).items() if k != child})
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            lines.update(_line_index(item, path + (i,)))
    return lines


def read_yaml(path: Path) -> tuple[dict, dict[tuple, int]]:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(path, f"cannot read ({exc.strerror or exc})") from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise InputError(where, f"malformed YAML: {problem}") from None
    if not isinstance(data, dict):
        raise InputError(path, "expected a YAML mapping at the top level")
    return data, _line_index(node) if node is not None else {}


def _describe(error: dict) -> str:
    location = ".".join(str(p) for p in error["loc"] if not (isinstance(p, str) and p.startswith("function-")))
    message = error["msg"].removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        message = "unknown key"
    elif error["type"] == "literal_error":
        message = f"{error['input']!r} is not allowed: {message.lower()}"
    return f"{location}: {message}" if location else message


def validate(data: dict, model: type[SpecT], path: Path, lines: dict[tuple, int]) -> SpecT:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = tuple(p for p in first["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        line = next((lines[loc[:n]] for n in range(len(loc), -1, -1) if loc[:n] in lines), None)
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise InputError(f"{path}:{line}" if line else path, _describe(first) + more) from None


def load_spec(path: Path, model: type[SpecT]) -> SpecT:
    data, lines = read_yaml(path)
    return validate(data, model, Path(path), lines)
