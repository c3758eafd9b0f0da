"""Load YAML configuration into typed specs, with errors that name the file and the line."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from workloads.core.errors import InputError
from workloads.core.paths import resolve_paths  # one rule for every file that names files (an EAR trial's too)

SpecT = TypeVar("SpecT", bound=BaseModel)


class DuplicateKey(ValueError):
    def __init__(self, key: str, line: int, first: int):
        super().__init__(f"{key}: set twice (first at line {first}): YAML would keep the last silently")
        self.key, self.line, self.first = key, line, first

    def __reduce__(self):  # picklable, as every project error
        return type(self), (self.key, self.line, self.first)


def _line_index(node: yaml.Node, path: tuple = ()) -> dict[tuple, int]:
    """Map every key path of a composed YAML document to its 1-based line; a key that appears
    twice in one mapping is an error (YAML loaders keep the last one without a word)."""
    lines = {path: node.start_mark.line + 1}
    if isinstance(node, yaml.MappingNode):
        seen: dict[object, int] = {}
        for key, value in node.value:
            if key.value in seen and key.tag != "tag:yaml.org,2002:merge":
                raise DuplicateKey(".".join(str(p) for p in (*path, key.value)), key.start_mark.line + 1, seen[key.value])
            seen[key.value] = key.start_mark.line + 1
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
    except UnicodeDecodeError as exc:
        line = path.read_bytes()[:exc.start].count(b"\n") + 1
        raise InputError(f"{path}:{line}", f"not UTF-8 text (byte {exc.object[exc.start]:#x} at offset {exc.start})") from None
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
    try:
        lines = _line_index(node) if node is not None else {}
    except DuplicateKey as exc:
        raise InputError(f"{path}:{exc.line}", str(exc)) from None
    return resolve_paths(data, path.parent), lines


def _describe(error: dict) -> str:
    location = ".".join(str(p) for p in error["loc"] if not (isinstance(p, str) and p.startswith("function-")))
    message = error["msg"].removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        message = "unknown key"
    elif error["type"] == "literal_error":
        message = f"{error['input']!r} is not allowed: {message.lower()}"
    return f"{location}: {message}" if location else message


def input_error(exc: ValidationError, path: Path, lines: dict[tuple, int], under: tuple = ()) -> InputError:
    """The first validation error as one line naming the file, the line and the key.

    ``under``: where the validated data sits in the file (a sweep's ``("base",)``), so an
    error in a cell's trial spec points at the base key that caused it.
    """
    first = exc.errors()[0]
    loc = under + tuple(p for p in first["loc"] if not (isinstance(p, str) and p.startswith("function-")))
    line = next((lines[loc[:n]] for n in range(len(loc), -1, -1) if loc[:n] in lines), None)
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return InputError(f"{path}:{line}" if line else path, _describe({**first, "loc": loc}) + more)


def validate(data: dict, model: type[SpecT], path: Path, lines: dict[tuple, int]) -> SpecT:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise input_error(exc, path, lines) from None


def load_spec(path: Path, model: type[SpecT]) -> SpecT:
    data, lines = read_yaml(path)
    return validate(data, model, Path(path), lines)


def check_kind_names(data: dict, path: Path, lines: dict[tuple, int]) -> None:
    """A ``kind:`` (at the top or in ``base``) that names no trial kind, as one line listing the
    kinds a file can name: unchecked, the file would be read as a re-ranking trial and fail on
    the first of the other kind's keys ("model.towers: unknown key")."""
    from workloads.kinds import DEFAULT_KIND, TRIAL_KINDS  # noqa: PLC0415  (lazy: the kinds load torch, 9 s)

    named = sorted(name for name, kind in TRIAL_KINDS.items() if "kind" in kind.spec.model_fields)
    for key in (("kind",), ("base", "kind")):
        holder = data.get(key[0]) if len(key) == 2 else data
        if not isinstance(holder, dict) or "kind" not in holder or holder["kind"] in named:
            continue
        value = holder["kind"]
        close = [n for n in named if str(value).strip().lower() == n] or difflib.get_close_matches(str(value), named, n=1)
        hint = f": did you mean '{close[0]}'?" if close else ""
        raise InputError(f"{path}:{lines.get(key, '?')}",
                         f"{'.'.join(key)}: unknown trial kind {value!r} (a file names kind: {', '.join(named)}; "
                         f"{_an(TRIAL_KINDS[DEFAULT_KIND].described_as)} trial names none){hint}")


def _an(word: str) -> str:
    return f"{'an' if word[:1].lower() in 'aeiou' else 'a'} {word}"


def _deep_merge(base: dict, override: dict) -> dict:
    merged = dict(base)
    for key, value in override.items():
        merged[key] = _deep_merge(merged[key], value) if isinstance(value, dict) and isinstance(merged.get(key), dict) else value
    return merged


def load_trials(path: Path, model: type[SpecT]) -> tuple[str, list[SpecT]]:
    """A trial file: either one trial, or ``name`` + ``base`` + ``trials: {name: overrides}``.

    Returns the experiment name and the trials; a trial of a multi-trial file is named
    ``<file name>.<trial name>``. Errors point at the override's line, else the base's.
    """
    path = Path(path)
    data, lines = read_yaml(path)
    check_kind_names(data, path, lines)
    if "trials" not in data:
        spec = validate(data, model, path, lines)
        return spec.name, [spec]
    unknown = set(data) - {"name", "base", "trials"}
    if unknown:
        key = sorted(unknown)[0]
        raise InputError(f"{path}:{lines.get((key,), '?')}", f"{key}: unknown key (a trial file has name, base, trials)")
    name, base, trials = data.get("name"), data.get("base") or {}, data["trials"]
    if not isinstance(name, str) or not isinstance(base, dict) or not isinstance(trials, dict) or not trials:
        raise InputError(path, "a trial file needs 'name' (text), 'base' (a mapping) and 'trials' (name -> overrides)")
    specs = []
    for trial_name, override in trials.items():
        if override is not None and not isinstance(override, dict):
            raise InputError(f"{path}:{lines.get(('trials', trial_name), '?')}",
                             f"trials.{trial_name}: expected a mapping of overrides, got {override!r}")
        merged = _deep_merge(base, override or {})
        merged["name"] = f"{name}.{trial_name}"
        # error lines: the override's key if it set it, else the base's
        trial_lines = {**{k[1:]: v for k, v in lines.items() if k[:1] == ("base",)},
                       **{k[2:]: v for k, v in lines.items() if k[:2] == ("trials", trial_name)}}
        specs.append(validate(merged, model, path, trial_lines))
    return name, specs
