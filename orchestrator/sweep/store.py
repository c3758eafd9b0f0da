"""A sweep's store on disk, ``<storage>/<sweep name>``: what tells it apart from a folder of the
user's, and which sweep file it belongs to.

A sweep writes its store into a folder it creates, and marks it there (:data:`MARKER`, with the
sweep's name) before anything else. ``reset`` removes only a marked store of its sweep (or one
written before the marker existed, recognised by holding nothing but what a sweep writes), and a
sweep never writes into a folder that holds anything else: a user's folder that happens to carry
the sweep's name (``--storage .`` beside a ``demo/`` folder) is refused, never used or emptied.

The store records the sweep file it belongs to (:data:`SWEEP_RECORD`) and where the store was
then, so that a store moved or copied with its project folder still belongs to the file at the
same place beside it, wherever the original is.
"""

from __future__ import annotations

import contextlib
import fcntl
import filecmp
import json
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.core import schema
from orchestrator.core.tracking import Tracker
from orchestrator.sweep.grid import SweepSpec, check_owner, sweep_file
from workloads.core.errors import InputError

MARKER = "orchestrate-store.json"  # written when orchestrate creates a store: {"written_by", "sweep", "created"}
SWEEP_RECORD = "sweep.json"   # in <storage>/<sweep>: the sweep file this store belongs to (and where the store was)
LOCK_FILE = "sweep.lock"      # held (flock) by the process running the sweep; says which process
WRITTEN_BY = "orchestrate (rerank-lab)"

# Everything a sweep writes directly in its store (SweepPaths: the Optuna database and its
# SQLite side files, Ray's storage, the record, the lock, the log). Stores written before the
# marker existed have none: a folder that holds only these, and at least one, is such a store.
STORE_ENTRIES = frozenset({"optuna.db", "optuna.db-journal", "optuna.db-wal", "optuna.db-shm", "ray", SWEEP_RECORD,
                           LOCK_FILE, "sweep.log", MARKER})


@dataclass(frozen=True)
class SweepPaths:
    """Where a sweep's state lives: its store ``root`` and what the sweep writes there."""

    root: Path
    optuna_url: str = field(init=False)  # the cells' studies: sqlite:///<root>/optuna.db
    ray_storage: Path = field(init=False)  # Ray Train's runs: each trial's checkpoints
    log_file: Path = field(init=False)  # Ray's and Tune's own output, and every worker's, when the terminal shows the progress display

    def __post_init__(self):  # plain values, computed once (they are read at every step of a sweep)
        object.__setattr__(self, "optuna_url", f"sqlite:///{self.root / 'optuna.db'}")
        object.__setattr__(self, "ray_storage", self.root / "ray")
        object.__setattr__(self, "log_file", self.root / "sweep.log")


def sweep_paths(sweep: SweepSpec, storage_root: Path) -> SweepPaths:
    """Where the sweep's state lives (nothing is created: the sweep itself creates it)."""
    return SweepPaths(Path(storage_root).resolve() / sweep.name)


def _marked_sweep(root: Path) -> str | None:
    try:
        data = json.loads((root / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return data.get("sweep") if isinstance(data, dict) and data.get("written_by") == WRITTEN_BY else None


def foreign_entries(root: Path, name: str) -> list[str] | None:
    """None when ``root`` is (or may become) the store of sweep ``name``: absent, empty, marked as
    its store, or a store written before the marker (nothing but what a sweep writes, a record
    of this sweep if any); otherwise the entries that make it someone else's (sorted)."""
    if not root.exists():
        return None
    if not root.is_dir():
        return [root.name]
    if (root / MARKER).exists():
        marked = _marked_sweep(root)
        return None if marked == name else [f"{MARKER} (of {marked!r})" if marked else MARKER]
    entries = sorted(p.name for p in root.iterdir())
    others = [e for e in entries if e not in STORE_ENTRIES]
    if others:
        return others
    record = _read_record(root)
    if record is not None and record.get("name") not in (None, name):
        return [f"{SWEEP_RECORD} (of {record.get('name')!r})"]
    return None


def describe_foreign(name: str, entries: list[str]) -> str:
    shown = ", ".join(entries[:3]) + (f" and {len(entries) - 3} more" if len(entries) > 3 else "")
    return (f"not a store of sweep '{name}' (it holds {shown}, which orchestrate did not write there): "
            "orchestrate writes and removes only a store it created; choose another --storage (or rename the folder)")


def claim_store(root: Path, name: str) -> None:
    """Create the store of sweep ``name`` at ``root`` and mark it (an empty folder, or a store
    written before the marker, is marked in place); a folder holding anything else is refused
    in one line, untouched."""
    foreign = foreign_entries(root, name)
    if foreign is not None:
        raise InputError(root, describe_foreign(name, foreign))
    if (root / MARKER).exists():
        return
    root.mkdir(parents=True, exist_ok=True)
    marker = root / f".{MARKER}.{os.getpid()}"
    marker.write_text(json.dumps({"written_by": WRITTEN_BY, "sweep": name, "created": time.strftime("%Y-%m-%d %H:%M:%S")},
                                 indent=1))
    marker.replace(root / MARKER)  # whole or absent, never half a marker


# ----------------------------------------------------------------------------- the owner


def _read_record(root: Path) -> dict | None:
    try:
        data = json.loads((root / SWEEP_RECORD).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise InputError(root / SWEEP_RECORD, f"cannot read this store's record ({exc}): it is left as it is") from None
    return data if isinstance(data, dict) else None


def record_owner(sweep, root: Path) -> bool:
    """Whether the store at ``root`` belongs to this sweep's file (one line naming both when it
    belongs to another that exists); True when its record should be written anew."""
    record = _read_record(root)
    if record is None:
        return check_owner(sweep, None, str(root))
    recorded, then = record.get("file"), record.get("store")
    mine = sweep_file(sweep)
    if then is None and recorded is not None and mine is not None and Path(recorded) != mine:
        # a record written before stores recorded where they were: a copy of the project folder
        # (the original file beside the original store, the same bytes as this one) is this sweep
        if Path(recorded).is_file() and filecmp.cmp(recorded, mine, shallow=False):
            return True
    return check_owner(sweep, recorded, str(root), (Path(then), root) if then else None)


def write_record(sweep, root: Path) -> None:
    (root / SWEEP_RECORD).write_text(json.dumps({"name": sweep.name, "file": str(sweep_file(sweep)), "store": str(root)},
                                                indent=1))


def experiment_owner(sweep, tracker, experiment) -> bool:
    """Whether MLflow experiment ``experiment`` (of this sweep's name) belongs to this sweep's
    file, as :func:`record_owner` (a SQLite store knows where it was: its artifact root)."""
    return check_owner(sweep, experiment.tags.get(schema.SWEEP_FILE_TAG), f"MLflow experiment '{sweep.name}' of {tracker.uri}",
                       tracker.store_homes(experiment))


# ----------------------------------------------------------------------------- who runs it


def bind_store(sweep: SweepSpec, paths: SweepPaths, tracker: Tracker | None = None, experiment=None) -> None:
    """Check, then record, which sweep file the storage (and the MLflow experiment) belongs to."""
    if record_owner(sweep, paths.root):
        write_record(sweep, paths.root)
    if tracker is not None and experiment is not None:
        if experiment_owner(sweep, tracker, experiment):
            tracker.client.set_experiment_tag(experiment.experiment_id, schema.SWEEP_FILE_TAG, str(sweep_file(sweep)))


def check_store_owner(sweep: SweepSpec, paths: SweepPaths, tracker: Tracker | None = None, experiment=None) -> None:
    """Read only: the storage and the MLflow experiment of this sweep's name belong to this
    sweep's file (or to none yet); another file's are one line (what ``status`` and ``reset``
    check before they read or remove anything). A store moved or copied with its sweep file
    belongs to the file beside it (:func:`~orchestrator.sweep.grid.check_owner`)."""
    if tracker is not None and experiment is not None:
        experiment_owner(sweep, tracker, experiment)
    record_owner(sweep, paths.root)


@contextlib.contextmanager
def sweep_lock(paths: SweepPaths):
    """One process runs a sweep at a time: a second one refuses with one line instead of racing
    the first for its trials (an exclusive ``flock`` on the storage's lock file, released when
    the process ends, however it ends)."""
    claim_store(paths.root, paths.root.name)  # never into a folder of the user's that has the sweep's name
    handle = open(paths.root / LOCK_FILE, "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise InputError(paths.root, f"the sweep is already running ({holder}): wait for it to end, or stop it first") from None
    try:
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        handle.flush()
        yield
    finally:
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()
