"""The first stage: where the candidates to re-rank (and the training negatives) come from.

``FIRST_STAGES`` is the registry, keyed by ``first_stage.method``:

- ``bm25``: Pyserini BM25 over the corpus (:mod:`workloads.retrieval.bm25`; the default);
- ``given``: the candidate lists a collection ships (answer selection, e.g. WikiQA), in
  their given order (:attr:`workloads.data.collections.Collection.given`);
- ``run``: any TREC run file (``first_stage.path``), e.g. the official top-100 runs AUG
  re-ranked; a query the file does not rank has no candidates (it counts 0 in evaluation,
  trec_eval ``-c``) and gives no training triple.

Each returns the run of the asked queries, cut to ``k``, and the path of its TREC file in
the cache (keyed by content), which the rest of a trial reads like BM25's.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

from workloads.data.collections import Collection
from workloads.errors import InputError
from workloads.logs import get_logger
from workloads.paths import cache_dir, stable_key
from workloads.retrieval.bm25 import BM25Params, read_trec_run, retrieve, write_trec_run

Run = dict[str, dict[str, float]]
FirstStage = Callable[[Collection, str, dict[str, str], int, object], tuple[Run, Path]]


def _top(run: Run, queries: dict[str, str], k: int) -> Run:
    out = {}
    for qid in queries:
        docs = sorted(run.get(qid, {}).items(), key=lambda item: (-item[1], item[0]))[:k]
        if docs:
            out[qid] = dict(docs)
    return out


def _cached(make: Callable[[], Run], kind: str, *key_parts: object) -> tuple[Run, Path]:
    """The run cached under these key parts; ``make`` computes it only when it is not cached."""
    path = cache_dir() / "runs" / f"{kind}-{stable_key(*key_parts)}.trec"
    if not path.exists():
        write_trec_run(make(), path, kind)
    return read_trec_run(path), path


def bm25(collection: Collection, split: str, queries: dict[str, str], k: int, spec) -> tuple[Run, Path]:
    return retrieve(collection, queries, k=k, params=BM25Params(k1=spec.k1, b=spec.b))


def given(collection: Collection, split: str, queries: dict[str, str], k: int, spec) -> tuple[Run, Path]:
    lists = collection.given_candidates(split)
    missing = [q for q in queries if q not in lists]
    if missing:
        raise InputError(collection.name, f"{len(missing)} queries of split '{split}' have no given candidates "
                                          f"(e.g. '{missing[0]}')")
    return _cached(lambda: _top(lists, queries, k), "given", collection.fingerprint, split, sorted(queries), k)


def run_file(collection: Collection, split: str, queries: dict[str, str], k: int, spec) -> tuple[Run, Path]:
    path = Path(spec.path).expanduser()
    if not path.is_file():
        raise InputError(spec.path, "first_stage path: no such run file")
    def make() -> Run:  # parsed only when this (file, queries, k) is not cached yet
        ranked = _top(read_trec_run(path), queries, k)
        if not ranked:
            raise InputError(path, f"ranks none of the {len(queries):,} queries of {collection.name} {split}")
        if len(ranked) < len(queries):
            get_logger("first-stage").warning(f"{path.name} ranks {len(ranked):,} of {len(queries):,} queries of "
                                              f"{collection.name} {split}; the others have no candidates")
        return ranked

    return _cached(make, "run", _file_digest(path), sorted(queries), k)


def _file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


FIRST_STAGES: dict[str, FirstStage] = {"bm25": bm25, "given": given, "run": run_file}


def first_stage_run(collection: Collection, split: str, queries: dict[str, str], k: int, spec) -> tuple[Run, Path]:
    """The candidates of ``queries`` (from ``split`` of ``collection``) under ``spec`` (a FirstStageSpec)."""
    if not queries:
        raise InputError(collection.name, f"no queries in split '{split}'")
    return FIRST_STAGES[spec.method](collection, split, queries, k, spec)


__all__ = ["FIRST_STAGES", "first_stage_run"]
