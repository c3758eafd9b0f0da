"""The first stage: where the candidates to re-rank (and the training negatives) come from.

``FIRST_STAGES`` is the registry, keyed by ``first_stage.method``; each entry
(:class:`FirstStageMethod`) declares the ``FirstStageSpec`` fields it reads and needs, its
label, what it requires first and how it is keyed. The built-in entries:

- ``bm25``: Pyserini BM25 over the corpus (:mod:`workloads.retrieval.bm25`; the default),
  indexed here or, with ``index: prebuilt``, Pyserini's prebuilt index of the collection;
- ``rm3``: BM25 with RM3 query expansion (``fb_terms``, ``fb_docs``, ``original_query_weight``;
  Pyserini's ``set_rm3``), the classical pseudo-relevance feedback baseline;
- ``given``: the candidate lists a collection ships (answer selection, e.g. WikiQA), in
  their given order (:attr:`workloads.data.collections.Collection.given`);
- ``scoreddocs``: the run an ir_datasets collection ships for the split (MS MARCO
  document's official top-100 for train and dev), streamed one query at a time;
- ``run``: any TREC run file (``first_stage.path``), e.g. the official top-100 runs AUG
  re-ranked; a query the file does not rank has no candidates (it counts 0 in evaluation,
  trec_eval ``-c``) and gives no training triple.

Trial kinds register the first stages they serve (``TrialKind.first_stages``, registered with
the kind in ``workloads.kinds.TRIAL_KINDS``): what a kept trial of theirs retrieved, its trial
file in ``first_stage.run`` (EAR's, :mod:`workloads.kinds.ear.first_stage`).

Each writes the run of the asked queries, cut to ``k``, as a TREC file in the cache (keyed
by content) and returns its path; :func:`first_stage_run` hands it on as a
:class:`FirstStageRun`, read only when something needs the rankings (a warm preparation
finds every product of a training split's run cached and never reads it).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workloads.core.errors import InputError
from workloads.core.logs import get_logger
from workloads.core.paths import cache_dir, stable_key
from workloads.data.collections import Collection
from workloads.data.identity import local_directory, remembered_file_hash
from workloads.data.irds import scored_documents
from workloads.evaluation.ranking import TIE_ORDER, top_of
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


def top_k(run: Run, queries: dict[str, str], k: int) -> Run:
    """Each asked query's top ``k`` in trec_eval's order (a tie at the cut is cut as trec_eval ranks it)."""
    out = {}
    for qid in queries:
        docs = top_of(run.get(qid, {}), k)
        if docs:
            out[qid] = docs
    return out


def cached_run(make: Callable[[], Run], kind: str, *key_parts: object) -> Path:
    """The run cached under these key parts; ``make`` computes it only when it is not cached."""
    path = cache_dir() / "runs" / f"{kind}-{stable_key(*key_parts, TIE_ORDER)}.trec"
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
    return cached_run(lambda: top_k(lists, queries, k), "given", collection.fingerprint, split, sorted(queries), k)


def run_file(collection: Collection, split: str, queries: dict[str, str], k: int, spec) -> Path:
    path = Path(spec.path).expanduser()
    if not path.is_file():
        raise InputError(spec.path, "first_stage path: no such run file")
    def make() -> Run:  # parsed only when this (file, queries, k) is not cached yet
        ranked = top_k(read_trec_run(path), queries, k)
        if not ranked:
            raise InputError(path, f"ranks none of the {len(queries):,} queries of {collection.name} {split}")
        if len(ranked) < len(queries):
            get_logger("first-stage").warning(f"{path.name} ranks {len(ranked):,} of {len(queries):,} queries of "
                                              f"{collection.name} {split}; the others have no candidates")
        return ranked

    return cached_run(make, "run", remembered_file_hash(path), sorted(queries), k)


def scoreddocs(collection: Collection, split: str, queries: dict[str, str], k: int, spec) -> Path:
    path = cache_dir() / "runs" / f"scoreddocs-{stable_key(collection.name.strip('/'), split, sorted(queries), k, TIE_ORDER)}.trec"
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


@dataclass(frozen=True)
class FirstStageMethod:
    """One ``first_stage.method``: how it retrieves and what it declares.

    ``retrieve(collection, split, queries, k, first_stage)`` writes the run (a TREC file in the
    cache) and returns its path. ``fields``: the ``FirstStageSpec`` fields it reads besides the
    depths, each with a few words on what it holds; ``needs``: those it cannot do without, with
    the words its error gives. ``label``: its row in ``orchestrate run``'s tables.
    ``searches_index``: it searches a BM25 index (``index`` names it; preflight checks prebuilt
    names). ``requires(first_stage)``: trial specs that must be finished first (a kind's kept
    trial). ``identity(first_stage)``: what a reading trial's key holds in place of the file in
    ``run`` (None: nothing). ``check(first_stage, collection, split, where)``: raise
    ``InputError`` when it can never serve that data. ``refuses(trial)``: why a re-ranking
    trial's other settings cannot read it (None: they can)."""

    name: str
    retrieve: Callable[[Collection, str, dict[str, str], int, Any], Path]
    label: str
    fields: dict[str, str] = field(default_factory=dict)
    needs: dict[str, str] = field(default_factory=dict)
    searches_index: bool = False
    requires: Callable[[Any], list] = lambda first_stage: []
    identity: Callable[[Any], str | None] = lambda first_stage: None
    check: Callable[[Any, str, str, str], None] = lambda first_stage, collection, split, where: None
    # as check, for what the data here decides (read, not computed): the dry run lists it, prepare refuses it
    preflight: Callable[[Any, str, str, str], None] = lambda first_stage, collection, split, where: None
    refuses: Callable[[Any], str | None] = lambda trial: None


FIRST_STAGES: dict[str, FirstStageMethod] = {}


def register_first_stage(method: FirstStageMethod) -> None:
    """Add a first stage (a trial kind's, through ``workloads.kinds``); a name is registered once."""
    known = FIRST_STAGES.get(method.name)
    if known is not None and known != method:
        raise ValueError(f"first stage '{method.name}' is registered twice")
    FIRST_STAGES[method.name] = method


def _no_shipped_run(first_stage, collection: str, split: str, where: str) -> None:
    if local_directory(collection) is not None:
        raise InputError(f"{where}.method", f"scoreddocs reads the run an ir_datasets collection ships; "
                                            f"{collection} is a local collection, which ships none: use bm25, or "
                                            "method run with a TREC run file")


_BM25_FIELDS = {"k1": "BM25's k1", "b": "BM25's b", "index": "the index searched"}
for _method in (
    FirstStageMethod("bm25", bm25, "BM25", fields=_BM25_FIELDS, searches_index=True),
    FirstStageMethod("rm3", rm3, "BM25+RM3", searches_index=True,
                     fields={**_BM25_FIELDS, "fb_terms": "expansion terms", "fb_docs": "feedback documents",
                             "original_query_weight": "the original query's weight"}),
    FirstStageMethod("given", given, "given order"),
    FirstStageMethod("run", run_file, "run file", fields={"path": "a TREC run file"}, needs={"path": "a TREC run file"}),
    FirstStageMethod("scoreddocs", scoreddocs, "shipped run", check=_no_shipped_run),
):
    register_first_stage(_method)


def first_stage_run(collection: Collection, split: str, queries: dict[str, str], k: int, spec) -> FirstStageRun:
    """The candidates of ``queries`` (from ``split`` of ``collection``) under ``spec`` (a FirstStageSpec)."""
    if not queries:
        raise InputError(collection.name, f"no queries in split '{split}'")
    return FirstStageRun(FIRST_STAGES[spec.method].retrieve(collection, split, queries, k, spec))


__all__ = ["FIRST_STAGES", "FirstStageMethod", "FirstStageRun", "cached_run", "first_stage_run", "register_first_stage", "top_k"]
