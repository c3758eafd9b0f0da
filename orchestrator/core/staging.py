"""What a grid needs on a cluster, checked offline before anything runs.

Two things stop a cluster's sweep after hours of preparation rather than at its start: a
first stage's prebuilt index name that the Anserini bundled with Pyserini does not know (it
downloads indexes by name, from its own catalog), and a local file the driver reads but the
GPU workers cannot, because it lies outside the storage every node mounts. The workers' storage
is ``$ORCHESTRATE_SHARED_DIR`` (``/mnt/shared`` on ``cluster.yaml``'s and ``k8s/raycluster.yaml``'s
nodes; several directories separated by ``:``); without it the workers share this machine's
files and only the index names are checked.

``orchestrate sweep --dry-run`` reports both with its other preflight problems;
``orchestrate prepare`` and ``orchestrate sweep`` refuse them before they prepare or write anything.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from workloads.core.errors import InputError
from workloads.data.identity import local_directory
from workloads.kinds import kind_of
from workloads.retrieval.bm25 import BUILD, PREBUILT, prebuilt_index_name
from workloads.retrieval.first_stage import FIRST_STAGES
from workloads.retrieval.prebuilt import check_prebuilt_index, prebuilt_index_names
from workloads.text.glove import resolve_glove_path

SHARED_DIR_ENV = "ORCHESTRATE_SHARED_DIR"
# Directories the workers read from through the environment the driver passes them
_ENVIRONMENT_DIRS = ("ORCHESTRATE_CACHE_DIR", "HF_HOME", "IR_DATASETS_HOME", "ANSERINI_INDEX_CACHE")


def shared_dirs() -> list[Path]:
    """The directories every node mounts ($ORCHESTRATE_SHARED_DIR), resolved; [] when unset."""
    value = os.environ.get(SHARED_DIR_ENV, "")
    return [Path(p).expanduser().resolve() for p in value.split(":") if p.strip()]


def index_names(spec) -> list[tuple[str, str, str]]:
    """(field, collection, prebuilt index name) of every first stage of a trial that searches a
    prebuilt index (its kind's ``first_stages_of``): its own collection's (training,
    validation) and its test collection's (``data.test_first_stage``, else ``first_stage``)."""
    names = []
    for where, collection, _, first_stage in kind_of(spec).first_stages_of(spec):
        if not FIRST_STAGES[first_stage.method].searches_index or first_stage.index == BUILD:
            continue
        field = f"{where.removeprefix('data.')}.index"
        try:
            name = prebuilt_index_name(collection) if first_stage.index == PREBUILT else first_stage.index
        except InputError as exc:
            names.append((field, collection, f"!{exc.problem}"))
            continue
        names.append((field, collection, name))
    return list(dict.fromkeys(names))


def index_problems(specs: Iterable) -> list[str]:
    """One line per prebuilt index name the bundled Anserini catalog cannot search with BM25."""
    problems: dict[str, None] = {}
    for spec in specs:
        for field, collection, name in index_names(spec):
            if name.startswith("!"):  # index: prebuilt for a collection that has none
                problems[f"{collection}: {field}: prebuilt: {name[1:]}"] = None
                continue
            try:
                check_prebuilt_index(name, field)
            except InputError as exc:
                # index: prebuilt derives the name from the collection: say which exist for it instead
                similar = [n for n in prebuilt_index_names() if name in n and n != name][:3]
                hint = f" (the catalog has {', '.join(similar)})" if similar else ""
                problems[f"{collection}: {exc}{hint}"] = None
    return list(problems)


def local_inputs(spec) -> list[tuple[str, Path]]:
    """(what, resolved path) of every local file or directory a trial reads: its collections'
    directories, GloVe files, TREC run files and a local model's directory."""
    found: list[tuple[str, Path]] = []
    data = spec.data
    for reference in dict.fromkeys(r for r in (data.collection, data.test_collection) if r):
        if (local := local_directory(reference)) is not None:
            found.append((f"collection {reference}", local))
    augmentation = getattr(spec, "augmentation", None)
    selector = augmentation.selector if augmentation is not None else None
    for glove in (getattr(augmentation, "glove_path", None), getattr(selector, "glove_path", None)):
        if glove:
            try:
                found.append((f"GloVe file {glove}", resolve_glove_path(glove).resolve()))
            except InputError:
                pass  # missing altogether: the preflight says so
    for first_stage in dict.fromkeys(fs for _, _, _, fs in kind_of(spec).first_stages_of(spec)):
        if first_stage.path:
            found.append((f"run file {first_stage.path}", Path(first_stage.path).expanduser().resolve()))
    model = Path(spec.model.name).expanduser()
    if model.is_dir():
        found.append((f"model {spec.model.name}", model.resolve()))
    return found


def staging_problems(specs: Iterable, shared: list[Path] | None = None) -> list[str]:
    """What the workers could not reach (one line each), and every prebuilt index name the
    bundled catalog does not hold. ``shared``: the workers' storage (default $ORCHESTRATE_SHARED_DIR)."""
    # trials that read a first stage (an EAR trial's retrieval is its own; a selector's is its trials')
    specs = [spec for spec in specs if kind_of(spec).first_stages_of(spec)]
    problems = dict.fromkeys(index_problems(specs))
    shared = shared_dirs() if shared is None else shared
    if not shared:
        return list(problems)
    where = ":".join(map(str, shared))

    def staged(path: Path) -> bool:
        return any(path == root or path.is_relative_to(root) for root in shared)

    for variable in _ENVIRONMENT_DIRS:
        if (value := os.environ.get(variable)) and not staged(Path(value).expanduser().resolve()):
            problems[f"{variable}={value}: not on the workers' storage ({SHARED_DIR_ENV}={where}): the workers would "
                     "not see what the driver prepares and downloads there"] = None
    for spec in specs:
        for what, path in local_inputs(spec):
            if not staged(path):
                problems[f"{path}: {what} is not on the workers' storage ({SHARED_DIR_ENV}={where}): copy it there "
                         "(docs/cluster.md, staging)"] = None
    return list(problems)


def require_staged(specs: Iterable, where: str) -> None:
    """Refuse (one line) what :func:`staging_problems` finds."""
    problems = staging_problems(specs)
    if problems:
        more = f" (and {len(problems) - 1} more: orchestrate sweep --dry-run lists them)" if len(problems) > 1 else ""
        raise InputError(where, f"{problems[0]}{more}")


__all__ = ["SHARED_DIR_ENV", "index_problems", "require_staged", "shared_dirs", "staging_problems"]
