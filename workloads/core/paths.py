"""Where the project reads data from and caches what it computes."""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from workloads.core.errors import InputError

DATA_DIR_ENV = "ORCHESTRATE_DATA_DIR"
CACHE_DIR_ENV = "ORCHESTRATE_CACHE_DIR"
# A test switch, never set in production (benchmarks/_chaos.py, tests/sweep/test_chaos.py):
# "COUNTER_FILE:N" makes the N-th of the project's atomic writes, counted across every process
# that shares COUNTER_FILE, fail with ENOSPC before its rename, as a full disk would. A test
# switch because a size-limited filesystem needs mount rights this machine's tests lack.
FULL_DISK_ENV = "ORCHESTRATE_TEST_ENOSPC_AT"


def data_dir() -> Path | None:
    value = os.environ.get(DATA_DIR_ENV)
    return _directory(DATA_DIR_ENV, Path(value).expanduser().resolve()) if value else None


def cache_dir() -> Path:
    """Cache for indexes, runs and training sets; shared storage on a cluster. Not created here:
    what writes an entry creates its directory (a command that only reads writes nothing)."""
    value = os.environ.get(CACHE_DIR_ENV)
    path = Path(value).expanduser() if value else Path.cwd() / ".orchestrate" / "cache"
    return _directory(CACHE_DIR_ENV, path.resolve())


def _directory(variable: str, path: Path) -> Path:
    """``path``, refused in one line when it or a parent is a file: every read and write below it
    would otherwise fail with a NotADirectoryError traceback. (A missing path is fine: what writes
    there creates it.)"""
    for existing in (path, *path.parents):
        if existing.exists():
            if not existing.is_dir():
                where = "" if existing == path else f" ({existing} is a file)"
                raise InputError(f"${variable}", f"{path} is not a directory{where}")
            return path
    return path


def stable_key(*parts: object) -> str:
    """A short content key for cache entries (same inputs -> same key, across machines)."""
    digest = hashlib.sha256("\x1f".join(repr(p) for p in parts).encode()).hexdigest()
    return digest[:16]


@contextmanager
def atomic_path(final: Path, suffix: str = "") -> Iterator[Path]:
    """Yield a temporary sibling path and rename it onto ``final`` only on success.

    A crash or an error leaves nothing half-written where readers look.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent)) / ("out" + suffix)
    try:
        yield tmp
        injected_full_disk(final)
        os.replace(tmp, final) if tmp.is_file() else _replace_dir(tmp, final)
    finally:
        _rmtree_quiet(tmp.parent)


def injected_full_disk(path: Path) -> None:
    """Raise ENOSPC when this is the write $ORCHESTRATE_TEST_ENOSPC_AT names (see FULL_DISK_ENV)."""
    value = os.environ.get(FULL_DISK_ENV)
    if not value:
        return
    counter_file, _, nth = value.rpartition(":")
    with open(counter_file, "a+") as handle:  # one count for every process of the run
        fcntl.flock(handle, fcntl.LOCK_EX)
        handle.seek(0)
        count = int(handle.read() or 0) + 1
        handle.seek(0)
        handle.truncate()
        handle.write(str(count))
    if count == int(nth):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))


def _replace_dir(src: Path, final: Path) -> None:
    if final.exists():
        _rmtree_quiet(final)
    os.replace(src, final)


def _rmtree_quiet(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


@contextmanager
def exclusive(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (a ``.lock`` sibling file) across processes of this
    machine, so that concurrent trials build a shared cache entry once: the second waits,
    then finds it built."""
    lock = path.with_name(path.name + ".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# Keys whose values are file or directory paths in a trial or sweep file; relative ones resolve
# against the YAML file's directory when they exist there, so a file means the same wherever the
# command runs (and wherever it is read from: a re-ranking trial's EAR trial file too).
PATH_KEYS = {"collection", "test_collection", "path", "glove_path", "run"}


def resolve_paths(data, base: Path):
    """``data`` with every relative path under :data:`PATH_KEYS` that exists next to the YAML
    file made absolute (normalised: one spelling, one cache entry). Names that are not such
    paths (``beir/scifact``, ``glove/glove.6B.50d...``, ir_datasets ids) stay as they are and
    resolve as before (``$ORCHESTRATE_DATA_DIR``, ir_datasets)."""
    if isinstance(data, list):
        return [resolve_paths(item, base) for item in data]
    if not isinstance(data, dict):
        return data
    out = {}
    for key, value in data.items():
        if key in PATH_KEYS and isinstance(value, str) and value and not Path(value).expanduser().is_absolute():
            candidate = (base / value).resolve()
            out[key] = str(candidate) if candidate.exists() else value
        else:
            out[key] = resolve_paths(value, base)
    return out
