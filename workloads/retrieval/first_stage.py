"""The first stage: where the candidates to re-rank (and the training negatives) come from.

``FIRST_STAGES`` is the registry, keyed by ``first_stage.method``:

- ``bm25``: Pyserini BM25 over the corpus (:mod:`workloads.retrieval.bm25`; the default),
  indexed here or, with ``index: prebuilt``, Pyserini's prebuilt index of the collection;
- ``rm3``: BM25 with RM3 query expansion (``fb_terms``, ``fb_docs``, ``original_query_weight``;
  Pyserini's ``set_rm3``), the classical pseudo-relevance feedback baseline;
- ``given``: the candidate lists a collection ships (answer selection, e.g. WikiQA), in
  their given order (:attr:`workloads.data.collections.Collection.given`);
- ``scoreddocs``: the run an ir_datasets collection ships for the split (MS MARCO
  document's official top-100 for train and dev), streamed one query at a time;
- ``ear``: what an EAR trial (``first_stage.run``, its trial file) retrieved with each query's
  chosen expansion (:mod:`workloads.expansion`): query reranking, then document re-ranking;
  the EAR trial is a requirement of the re-ranking trial, trained first;
- ``run``: any TREC run file (``first_stage.path``), e.g. the official top-100 runs AUG
  re-ranked; a query the file does not rank has no candidates (it counts 0 in evaluation,
  trec_eval ``-c``) and gives no training triple.

Each writes the run of the asked queries, cut to ``k``, as a TREC file in the cache (keyed
by content) and returns its path; :func:`first_stage_run` hands it on as a
:class:`FirstStageRun`, read only when something needs the rankings (a warm preparation
finds every product of a training split's run cached and never reads it).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from workloads.data.collections import Collection, remembered_file_hash, resolve_collection, scored_documents
from workloads.errors import InputError, RequirementNotTrained
from workloads.logs import get_logger
from workloads.paths import cache_dir, stable_key
from workloads.retrieval.bm25 import (
    BM25Params,
    RM3Params,
    add_trec_line,
    read_trec_run,
    retrieved_run,
    write_trec_rankings,
    write_trec_run,
)

Run = dict[str, dict[str, float]]
FirstStage = Callable[[Collection, str, dict[str, str], int, object], Path]


class FirstStageRun:
    """A first stage's run: its TREC file in the cache (``path``; ``key``, its content key, names
    it in the keys of what is built from it), read once when ``run`` is first asked for."""

    def __init__(self, path: Path):
        self.path, self.key = Path(path), Path(path).stem
        self._run: Run | None = None

    @property
    def run(self) -> Run:
        if self._run is None:
            self._run = read_trec_run(self.path)
        return self._run

    def rankings(self, query_ids: Iterable[str]) -> Iterator[tuple[str, dict[str, float]]]:
        """Each asked query's ranking (doc id -> score), in the order asked, read from the file one
        query at a time through an index of where each query's lines are (one pass to build): a
        training split's run (MS MARCO document: 36.7M lines, several GB as a dict) is never held
        whole. The same rankings as ``run``'s."""
        if self._run is not None:
            yield from ((qid, self._run.get(qid, {})) for qid in query_ids)
            return
        blocks = _query_blocks(self.path)
        with open(self.path, "rb") as handle:
            for qid in query_ids:
                ranking: Run = {}
                for offset, length in blocks.get(qid, ()):
                    handle.seek(offset)
                    for line in handle.read(length).decode("utf-8").splitlines():
                        add_trec_line(ranking, line, self.path)
                yield qid, ranking.get(qid, {})


# A cached run file never changes, and a sweep draws several training sets from one: its index is
# kept (MS MARCO's training run: ~100 MB for 367k queries; validation and test runs: far less).
@functools.lru_cache(maxsize=4)
def _query_blocks(path: Path) -> dict[str, list[tuple[int, int]]]:
    """Query id -> the (offset, length) of each run of consecutive lines it has in a TREC run file."""
    blocks: dict[str, list[tuple[int, int]]] = {}
    current, start, offset = None, 0, 0
    with open(path, "rb") as handle:
        for line in handle:
            qid = line.split(maxsplit=1)[0].decode("utf-8") if line.strip() else current
            if qid != current:
                if current is not None:
                    blocks.setdefault(current, []).append((start, offset - start))
                current, start = qid, offset
            offset += len(line)
    if current is not None:
        blocks.setdefault(current, []).append((start, offset - start))
    return blocks


def _top(run: Run, queries: dict[str, str], k: int) -> Run:
    out = {}
    for qid in queries:
        docs = sorted(run.get(qid, {}).items(), key=lambda item: (-item[1], item[0]))[:k]
        if docs:
            out[qid] = dict(docs)
    return out


def _cached(make: Callable[[], Run], kind: str, *key_parts: object) -> Path:
    """The run cached under these key parts; ``make`` computes it only when it is not cached."""
    path = cache_dir() / "runs" / f"{kind}-{stable_key(*key_parts)}.trec"
    if not path.exists():
        write_trec_run(make(), path, kind)
    return path


def bm25(collection: Collection, split: str, queries: dict[str, str], k: int, spec) -> Path:
    return retrieved_run(collection, queries, k=k, params=BM25Params(k1=spec.k1, b=spec.b), index=spec.index)


def rm3(collection: Collection, split: str, queries: dict[str, str], k: int, spec) -> Path:
    return retrieved_run(collection, queries, k=k, params=BM25Params(k1=spec.k1, b=spec.b), index=spec.index,
                         rm3=RM3Params(fb_terms=spec.fb_terms, fb_docs=spec.fb_docs,
                                       original_query_weight=spec.original_query_weight))


def given(collection: Collection, split: str, queries: dict[str, str], k: int, spec) -> Path:
    lists = collection.given_candidates(split)
    missing = [q for q in queries if q not in lists]
    if missing:
        raise InputError(collection.name, f"{len(missing)} queries of split '{split}' have no given candidates "
                                          f"(e.g. '{missing[0]}')")
    return _cached(lambda: _top(lists, queries, k), "given", collection.fingerprint, split, sorted(queries), k)


def run_file(collection: Collection, split: str, queries: dict[str, str], k: int, spec) -> Path:
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

    return _cached(make, "run", remembered_file_hash(path), sorted(queries), k)


def scoreddocs(collection: Collection, split: str, queries: dict[str, str], k: int, spec) -> Path:
    path = cache_dir() / "runs" / f"scoreddocs-{stable_key(collection.name.strip('/'), split, sorted(queries), k)}.trec"
    if not path.exists():
        write_trec_rankings(_grouped(scored_documents(collection.name, split), set(queries), collection.name), path,
                            "scoreddocs", k)
    return path


def _grouped(scored: Iterator[tuple[str, str, float]], wanted: set[str], source: str) -> Iterator[tuple[str, dict[str, float]]]:
    """(query id, its ranking) of the asked queries from a stream of (query, doc, score) grouped
    by query (as ir_datasets ships them): one query's ranking held at a time."""
    done: set[str] = set()
    current, ranking = None, {}
    for qid, doc_id, score in scored:
        if qid != current:
            if current in wanted:
                yield current, ranking
            if qid in done:
                raise InputError(source, f"scoreddocs of query '{qid}' are not grouped by query")
            done.add(qid)
            current, ranking = qid, {}
        if qid in wanted:
            ranking[doc_id] = score
    if current in wanted:
        yield current, ranking


class EarNotTrained(RequirementNotTrained):
    """A re-ranking trial's first stage is an EAR trial that has not finished yet."""


def ear(collection: Collection, split: str, queries: dict[str, str], k: int, spec) -> Path:
    from workloads.expansion.kind import RUN_FILE, ear_dir, load_ear_trial, trained_ear

    trial = load_ear_trial(spec.run)
    if resolve_collection(trial.data.collection).fingerprint != collection.fingerprint:
        raise InputError(spec.run, f"EAR trial {trial.name} ranks {trial.data.collection}, not {collection.name}: an EAR "
                                   "first stage serves its own collection's trials")
    kept = trained_ear(trial)
    if kept is None:
        raise EarNotTrained(spec.run, f"EAR trial {trial.name} is not trained yet ({ear_dir(trial)}): `orchestrate run` "
                                      "and `orchestrate sweep` train it first")
    path = kept / RUN_FILE

    def make() -> Run:
        ranked = _top(read_trec_run(path), queries, k)
        if not ranked:
            raise InputError(spec.run, f"EAR trial {trial.name} ranked none of the {len(queries):,} queries of "
                                       f"{collection.name} {split}: give both trials the same data")
        if len(ranked) < len(queries):
            get_logger("first-stage").warning(f"EAR trial {trial.name} ranks {len(ranked):,} of {len(queries):,} queries "
                                              f"of {collection.name} {split}; the others have no candidates")
        return ranked

    return _cached(make, "ear", remembered_file_hash(path), sorted(queries), k)


FIRST_STAGES: dict[str, FirstStage] = {"bm25": bm25, "rm3": rm3, "given": given, "run": run_file, "scoreddocs": scoreddocs,
                                       "ear": ear}


def first_stage_run(collection: Collection, split: str, queries: dict[str, str], k: int, spec) -> FirstStageRun:
    """The candidates of ``queries`` (from ``split`` of ``collection``) under ``spec`` (a FirstStageSpec)."""
    if not queries:
        raise InputError(collection.name, f"no queries in split '{split}'")
    return FirstStageRun(FIRST_STAGES[spec.method](collection, split, queries, k, spec))


__all__ = ["FIRST_STAGES", "EarNotTrained", "FirstStageRun", "first_stage_run"]
