"""Checks every kind's preflight shares: found offline, without preparing, one line each."""

from __future__ import annotations

from workloads.core.errors import InputError
from workloads.data.identity import local_directory


class Problems:
    """The lines that would stop a trial, in order, each once."""

    def __init__(self) -> None:
        self.lines: dict[str, None] = {}

    def add(self, line: str) -> None:
        self.lines[line] = None

    def check(self, call, *args, **kwargs) -> None:
        """``call(*args, **kwargs)``; the line of the :class:`InputError` it raises, if any."""
        try:
            call(*args, **kwargs)
        except InputError as exc:
            self.add(str(exc))

    def __iter__(self):
        return iter(self.lines)

    def list(self) -> list[str]:
        return list(self.lines)


def require_known_dataset(reference: str) -> None:
    """An ir_datasets id it knows (nothing is downloaded: loading an id reads its registry only)."""
    try:
        import ir_datasets

        ir_datasets.load(reference)
    except KeyError:
        raise InputError(reference, "unknown dataset: not a local directory, not under $ORCHESTRATE_DATA_DIR, "
                                    "not an ir_datasets id") from None


def check_collections(problems: Problems, *references: str | None) -> None:
    """Each distinct collection is a local directory or an ir_datasets id."""
    for reference in dict.fromkeys(r for r in references if r):
        if local_directory(reference) is None:
            problems.check(require_known_dataset, reference)
