"""One typed notion of a test collection: corpus, queries, graded qrels, named splits.

Sources:
- a BEIR-format directory (``corpus.jsonl[.gz]``, ``queries.jsonl``, ``qrels/<split>.tsv``
  with or without header, CRLF tolerated);
- TREC files: a topics TSV (``qid<TAB>text``) and a qrels file (``qid Q0 docid rel``),
  optionally with a corpus from another reference;
- the official WikiQA files (``WikiQA-{dev,test}.tsv``, ``WikiQA-train.txt[.gz]`` with its
  ``.ref``; :func:`load_wikiqa_directory`), an answer-selection set whose candidate lists
  come with it (``Collection.given``);
- ir_datasets ids (``msmarco-document/trec-dl-2019/judged``, ``beir/<name>``), which
  download on a connected machine and fail offline with a clear message.

``resolve_collection("beir/scifact")`` looks for ``$ORCHESTRATE_DATA_DIR/scifact`` first and
only then asks ir_datasets.

A local directory may hold a ``collection.yaml`` that states the collection's properties
instead of leaving them to a guess:

    relevance_level: 2        # the minimum grade that counts as relevant (binary measures, positives)
    corpus: msmarco-document  # the corpus to re-rank, for topics-and-qrels directories

Without it the relevance level is guessed: 2 for TREC-DL (a directory or ir_datasets id
with "dl" / "trec-dl" in its name: the track's guidelines count grades >= 2 for binary
measures), 1 otherwise.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import pyarrow as pa

from workloads.data.docstore import STORE_VERSION, ArrowIds, DocStore, build_docstore, write_ids
from workloads.data.document import Document
from workloads.errors import InputError
from workloads.paths import atomic_path, cache_dir, data_dir, exclusive, stable_key

Qrels = dict[str, dict[str, int]]  # query id -> doc id -> graded relevance


@dataclass
class Collection:
    """A corpus with queries and graded relevance judgements per named split.

    ``relevance_level`` is the minimum grade that counts as relevant for binary measures
    (AP, RR, P) and for picking training positives: 1 for BEIR, 2 for TREC-DL.
    """

    name: str
    corpus: Mapping[str, Document] | None
    queries: dict[str, str]
    qrels: dict[str, Qrels]
    relevance_level: int = 1
    # split -> query id -> doc id -> score: candidate lists that ship with the collection
    # (answer selection), in their given order (descending scores); ``first_stage: given``
    given: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    _fingerprint: str | None = field(default=None, repr=False)
    _fingerprint_of: Callable[[], str] | None = field(default=None, repr=False)  # how a reader computes it, when asked

    @property
    def splits(self) -> list[str]:
        return sorted(self.qrels)

    def split_qrels(self, split: str) -> Qrels:
        if split not in self.qrels:
            known = ", ".join(self.splits) or "none"
            raise InputError(self.name, f"no split '{split}' (splits: {known})")
        return self.qrels[split]

    def split_queries(self, split: str) -> dict[str, str]:
        """The queries judged in ``split``, in sorted id order."""
        judged = self.split_qrels(split)
        missing = [q for q in judged if q not in self.queries]
        if missing:
            raise InputError(self.name, f"split '{split}' judges {len(missing)} queries with no text (e.g. '{missing[0]}')")
        return {q: self.queries[q] for q in sorted(judged)}

    def given_candidates(self, split: str) -> dict[str, dict[str, float]]:
        """The candidate lists that come with ``split`` (``first_stage: given``)."""
        if split not in self.given:
            known = ", ".join(sorted(self.given)) or "none: this collection ships no candidate lists"
            raise InputError(self.name, f"no given candidates for split '{split}' (splits with candidates: {known}); "
                                        "use first_stage method bm25 or run")
        return self.given[split]

    def require_corpus(self) -> Mapping[str, Document]:
        if self.corpus is None:
            raise InputError(self.name, "has no corpus (topics and qrels only): give a corpus to index or re-rank")
        return self.corpus

    def document(self, doc_id: str) -> Document:
        try:
            return self.require_corpus()[doc_id]
        except KeyError:
            raise InputError(self.name, f"document '{doc_id}' is not in the corpus") from None

    @property
    def fingerprint(self) -> str:
        """What cache keys for indexes, runs and training sets hang on. A collection opened by
        :func:`resolve_collection` carries its identity (:func:`collection_identity`: remembered
        per set of file sizes and times, or an ir_datasets id and version), so no process reads
        the corpus for it; one built in memory hashes its corpus's content, once."""
        if self._fingerprint is None and self._fingerprint_of is not None:
            self._fingerprint = self._fingerprint_of()
        if self._fingerprint is None:
            digest = hashlib.sha256()
            for doc in self.require_corpus().values():
                digest.update(f"{doc.doc_id}\x1f{doc.title}\x1f{doc.text}\x1e".encode())
            self._fingerprint = digest.hexdigest()[:16]
        return self._fingerprint


# --------------------------------------------------------------------------- readers


def _open_text(path: Path) -> io.TextIOBase:
    # newline=None turns CRLF into LF, so BEIR's CRLF qrels read like any other.
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline=None)
    return open(path, encoding="utf-8", newline=None)


def _first_existing(*candidates: Path) -> Path | None:
    return next((p for p in candidates if p.exists()), None)


def _read_jsonl(path: Path, required: tuple[str, ...]) -> Iterator[dict]:
    try:
        with _open_text(path) as handle:
            for line_no, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise InputError(f"{path}:{line_no}", f"not valid JSON ({exc.msg})") from None
                if not isinstance(record, dict):
                    raise InputError(f"{path}:{line_no}", "expected a JSON object")
                missing = [k for k in required if k not in record]
                if missing:
                    raise InputError(f"{path}:{line_no}", f"missing field(s) {', '.join(repr(m) for m in missing)}")
                yield record
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise InputError(path, f"cannot read ({exc})") from None


def _beir_records(path: Path) -> Iterator[tuple[str, str, str]]:
    """(doc id, title, text) of a BEIR corpus file, streamed."""
    for record in _read_jsonl(path, ("_id", "text")):
        yield str(record["_id"]), str(record.get("title") or ""), str(record["text"] or "")


class BeirCorpus(Mapping[str, Document]):
    """A local BEIR corpus, read through its store (:mod:`workloads.data.docstore`): converted from
    the file once per content, when first read, then memory-mapped by every process. Nothing of
    the corpus is read to open a collection, and it travels to Ray tasks as its path."""

    def __init__(self, corpus_file: Path, directory: Path):
        self.corpus_file, self.directory = Path(corpus_file), Path(directory)
        self._docstore: DocStore | None = None

    def __getstate__(self) -> dict:
        return {"corpus_file": self.corpus_file, "directory": self.directory}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["corpus_file"], state["directory"])

    def store(self) -> DocStore:
        if self._docstore is None:
            key = corpus_fingerprint(self.directory, str(self.directory))
            self._docstore = build_docstore(_beir_records(self.corpus_file),
                                            cache_dir() / "docstores" / f"{key}-v{STORE_VERSION}", self.corpus_file)
        return self._docstore

    def __getitem__(self, doc_id: str) -> Document:
        return self.store()[doc_id]

    def __contains__(self, doc_id: object) -> bool:
        return doc_id in self.store()

    def __iter__(self) -> Iterator[str]:
        return iter(self.store())

    def __len__(self) -> int:
        return len(self.store())

    def values(self):  # type: ignore[override]  # stream the documents in file order
        return self.store().values()

    def sorted_ids(self) -> Sequence[str]:
        return self.store().sorted_ids()


def read_beir_queries(path: Path) -> dict[str, str]:
    queries: dict[str, str] = {}
    for number, record in enumerate(_read_jsonl(path, ("_id", "text")), 1):
        query_id = str(record["_id"])
        if query_id in queries and queries[query_id] != str(record["text"]):
            raise InputError(path, f"query '{query_id}' appears twice with different texts (record {number}): which "
                                   "text is meant? give every query one _id")
        queries[query_id] = str(record["text"])
    if not queries:
        raise InputError(path, "no queries")
    return queries


def _numbered_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, line) of a text file (gzip or not, CRLF tolerated); unreadable is one clear error."""
    try:
        with _open_text(path) as handle:
            yield from enumerate(handle, 1)
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise InputError(path, f"cannot read ({exc})") from None


def read_qrels(path: Path) -> Qrels:
    """BEIR TSV (``query-id corpus-id score``, header optional) or TREC (``qid Q0 docid rel``).

    Whitespace-separated, CRLF tolerated; a wrong column count or a non-integer grade is an
    error naming the line.
    """
    qrels: Qrels = {}
    for line_no, line in _numbered_lines(path):
        fields = line.split()
        if not fields:
            continue
        if line_no == 1 and fields[0].lower() in {"query-id", "query_id", "qid", "query"}:
            continue  # BEIR header
        if len(fields) == 3:
            qid, docid, grade = fields
        elif len(fields) == 4:
            qid, _, docid, grade = fields
        else:
            raise InputError(
                f"{path}:{line_no}",
                f"expected 3 columns (query-id corpus-id score) or 4 (TREC: qid Q0 docid rel), got {len(fields)}",
            )
        try:
            rel = int(grade)
        except ValueError:
            raise InputError(f"{path}:{line_no}", f"relevance '{grade}' is not an integer") from None
        qrels.setdefault(qid, {})[docid] = rel
    if not qrels:
        raise InputError(path, "no judgements")
    return qrels


def read_trec_topics(path: Path) -> dict[str, str]:
    """Topics as TSV ``qid<TAB>text`` (Anserini's ``topics.*.txt``/``.tsv`` layout)."""
    topics: dict[str, str] = {}
    for line_no, line in _numbered_lines(path):
        if not line.strip():
            continue
        fields = line.rstrip("\n").split("\t")
        if len(fields) < 2 or not fields[1].strip():
            raise InputError(f"{path}:{line_no}", "expected 'query-id<TAB>query text'")
        query_id, text = fields[0].strip(), fields[1].strip()
        if query_id in topics and topics[query_id] != text:
            raise InputError(f"{path}:{line_no}", f"topic '{query_id}' appears twice with different texts: which "
                                                  "text is meant? give every topic one id")
        topics[query_id] = text
    if not topics:
        raise InputError(path, "no topics")
    return topics


# --------------------------------------------------------------------------- sources


def load_beir_directory(path: Path, name: str | None = None) -> Collection:
    path = Path(path)
    corpus_file = _first_existing(path / "corpus.jsonl", path / "corpus.jsonl.gz")
    if corpus_file is None:
        raise InputError(path, "not a BEIR directory: no corpus.jsonl or corpus.jsonl.gz")
    queries_file = _first_existing(path / "queries.jsonl", path / "queries.jsonl.gz")
    if queries_file is None:
        raise InputError(path, "not a BEIR directory: no queries.jsonl")
    qrels_files = sorted((path / "qrels").glob("*.tsv")) if (path / "qrels").is_dir() else []
    if not qrels_files:
        raise InputError(path, "not a BEIR directory: no qrels/<split>.tsv")
    return Collection(
        name=name or path.name,
        corpus=BeirCorpus(corpus_file, path),
        queries=read_beir_queries(queries_file),
        qrels={f.stem: read_qrels(f) for f in qrels_files},
    )


def load_trec_files(
    topics: Path,
    qrels: Path,
    *,
    name: str,
    split: str = "test",
    corpus: Mapping[str, Document] | None = None,
    relevance_level: int = 1,
) -> Collection:
    return Collection(
        name=name,
        corpus=corpus,
        queries=read_trec_topics(Path(topics)),
        qrels={split: read_qrels(Path(qrels))},
        relevance_level=relevance_level,
    )


def load_trec_directory(path: Path, name: str | None = None) -> Collection:
    """A directory with one ``topics*`` and one ``qrels*`` file (e.g. trec-dl-2019-doc)."""
    path = Path(path)
    topics = sorted(p for p in path.glob("topics*") if p.is_file())
    qrels = sorted(p for p in path.glob("qrels*") if p.is_file())
    if len(topics) != 1 or len(qrels) != 1:
        raise InputError(path, f"expected one topics* and one qrels* file, found {len(topics)} and {len(qrels)}")
    # The guess when no collection.yaml says otherwise: TREC-DL grades 0-3 and counts >= 2
    # as relevant for binary measures (track guidelines).
    relevance_level = 2 if "dl" in path.name.lower() else 1
    return load_trec_files(topics[0], qrels[0], name=name or path.name, relevance_level=relevance_level)


def _given_run(lists: dict[str, list[str]]) -> dict[str, dict[str, float]]:
    """Candidate lists as a run whose scores keep the given order (first = highest)."""
    return {q: {d: float(len(docs) - i) for i, d in enumerate(docs)} for q, docs in lists.items()}


WIKIQA_TEST_FILE = "WikiQA-test.tsv"
UNFILTERED = "-unfiltered"
ANSWERED = "-answered"  # every question with a correct candidate: CFT's test set (243; dev 126)


def _read_wikiqa_ref(path: Path) -> list[tuple[str, str, int]]:
    """``question_index 0 sentence_index label`` rows, in file order."""
    rows = []
    for line_no, line in _numbered_lines(path):
        fields = line.split()
        if not fields:
            continue
        if len(fields) != 4 or not fields[3].lstrip("-").isdigit():
            raise InputError(f"{path}:{line_no}", "expected 'question_index 0 sentence_index label'")
        rows.append((fields[0], fields[2], int(fields[3])))
    return rows


def _read_wikiqa_split(path: Path, split: str) -> tuple[list[tuple[str, str, str, str, int]], dict[str, str]]:
    """(question index, question id, question, sentence id, label) rows and the sentence texts,
    from the official TSV (dev, test) or, for train, the tokenised ``.txt[.gz]``; both aligned
    row by row with ``.ref``."""
    stem = f"WikiQA-{split}"
    ref = _read_wikiqa_ref(path / f"{stem}.ref")
    tsv = path / f"{stem}.tsv"
    source = tsv if tsv.exists() else _first_existing(path / f"{stem}.txt", path / f"{stem}.txt.gz")
    if source is None:
        raise InputError(path, f"no {stem}.tsv or {stem}.txt[.gz]")
    records = [(n, line.rstrip("\n")) for n, line in _numbered_lines(source) if line.strip()]
    if source == tsv:
        expected = ["QuestionID", "Question", "DocumentID", "DocumentTitle", "SentenceID", "Sentence", "Label"]
        if not records or records[0][1].split("\t") != expected:
            raise InputError(tsv, f"expected the header {' '.join(expected)}")
        records = records[1:]
    columns = 7 if source == tsv else 3
    if len(records) != len(ref):
        raise InputError(source, f"{len(records)} rows but {stem}.ref has {len(ref)}: the files must align")
    rows: list[tuple[str, str, str, str, int]] = []
    texts: dict[str, str] = {}
    for (line_no, line), (q_index, s_index, label) in zip(records, ref):
        fields = line.split("\t")
        if len(fields) != columns:
            raise InputError(f"{source}:{line_no}", f"expected {columns} tab-separated columns, got {len(fields)}")
        if source == tsv:
            question_id, question, _, _, sentence_id, sentence, text_label = fields
        else:  # train: no ids in the shipped files; the .ref indices name question and sentence
            question, sentence, text_label = fields
            question_id, sentence_id = f"T{q_index}", f"T{q_index}-{s_index}"
        if text_label.strip() != str(label):
            raise InputError(f"{source}:{line_no}", f"label {text_label.strip()} disagrees with {stem}.ref ({label})")
        rows.append((q_index, question_id, question, sentence_id, label))
        texts[sentence_id] = sentence
    return rows, texts


def load_wikiqa_directory(path: Path, name: str | None = None) -> Collection:
    """WikiQA (Yang, Yih, Meek, EMNLP 2015) from its official files (``$ORCHESTRATE_DATA_DIR/wikiqa``).

    Splits ``train``, ``dev``, ``test``: ``dev`` and ``test`` are the standard filtered sets
    (``WikiQA-*-filtered.ref``: questions with at least one correct and one incorrect
    candidate: 122 and 237 questions), ``dev-answered`` and ``test-answered`` every question
    with at least one correct candidate (126 and 243: the sets CFT's P@1 implies, those whose
    candidates are all correct included), ``dev-unfiltered`` and ``test-unfiltered`` every
    question (296 and 633); ``train`` is every training question (2,118; 873 have an
    answer). A document is one candidate sentence (dev/test: its ``SentenceID``; train,
    shipped without ids: ``T<question>-<sentence>`` from the ``.ref`` indices), a query id
    the ``QuestionID`` (train: ``T<question index>``). Each split's candidate lists, in the
    official order, are its ``given`` run.
    """
    path = Path(path)
    corpus: dict[str, Document] = {}
    queries: dict[str, str] = {}
    qrels: dict[str, Qrels] = {}
    given: dict[str, dict[str, dict[str, float]]] = {}
    for split in ("train", "dev", "test"):
        rows, texts = _read_wikiqa_split(path, split)
        corpus.update({d: Document(d, "", t) for d, t in texts.items()})
        lists: dict[str, list[str]] = {}
        judged: Qrels = {}
        index_to_id: dict[str, str] = {}
        for q_index, question_id, question, sentence_id, label in rows:
            queries[question_id] = question
            index_to_id[q_index] = question_id
            lists.setdefault(question_id, []).append(sentence_id)
            judged.setdefault(question_id, {})[sentence_id] = label
        filtered_file = path / f"WikiQA-{split}-filtered.ref"
        if split == "train" or not filtered_file.exists():
            names = {split: set(lists)}
        else:
            kept = {index_to_id[q] for q, _, _ in _read_wikiqa_ref(filtered_file) if q in index_to_id}
            answered = {q for q, grades in judged.items() if any(g > 0 for g in grades.values())}
            names = {split: kept, f"{split}{UNFILTERED}": set(lists), f"{split}{ANSWERED}": answered}
        for split_name, ids in names.items():
            qrels[split_name] = {q: judged[q] for q in sorted(ids)}
            given[split_name] = _given_run({q: lists[q] for q in sorted(ids)})
    return Collection(name=name or path.name, corpus=corpus, queries=queries, qrels=qrels, given=given)


_KNOWN_SPLITS = ("train", "dev", "validation", "test")


class _IrdsDocs(Mapping[str, Document]):
    """A lazy corpus over an ir_datasets docs store (MS MARCO does not fit in memory)."""

    def __init__(self, dataset, ref: str):
        self._dataset = dataset
        self._ref = ref
        self._store = None

    def _docs_store(self):
        if self._store is None:
            self._store = _irds_call(self._ref, self._dataset.docs_store)
        return self._store

    def __getitem__(self, doc_id: str) -> Document:
        doc = _irds_call(self._ref, self._docs_store().get, doc_id)
        if doc is None:
            raise KeyError(doc_id)
        return _irds_document(doc)

    def __iter__(self) -> Iterator[str]:
        for doc in _guarded_iter(self._ref, self._dataset.docs_iter):
            yield doc.doc_id

    def __len__(self) -> int:
        return _irds_call(self._ref, self._dataset.docs_count)

    def values(self):  # type: ignore[override]  # stream documents, not lookups by id
        for doc in _guarded_iter(self._ref, self._dataset.docs_iter):
            yield _irds_document(doc)

    def sorted_ids(self) -> Sequence[str]:
        """Every id in sorted order, listed once per corpus (one pass) and memory-mapped after."""
        import ir_datasets

        path = cache_dir() / "document-ids" / f"{stable_key(ir_datasets.docs_parent_id(self._ref.strip('/')))}.arrow"
        if not path.exists():
            with exclusive(path):  # concurrent preparations list the corpus once
                if not path.exists():
                    with atomic_path(path, ".arrow") as tmp:
                        write_ids(pa.array(sorted(iter(self)), pa.string()), tmp)
        return ArrowIds(path)


def sorted_document_ids(corpus: Mapping[str, Document]) -> Sequence[str]:
    """Every document id of ``corpus`` in sorted order, without a list of them all where the corpus
    is a store (a local BEIR corpus, an ir_datasets docstore)."""
    return corpus.sorted_ids() if hasattr(corpus, "sorted_ids") else sorted(corpus)


def _guarded_iter(ref: str, make: Callable[[], Iterator]) -> Iterator:
    """Stream from ir_datasets (a corpus does not fit in memory), its errors as one clear line."""
    try:
        with _quiet_ir_datasets():
            iterator = iter(make())
            first = next(iterator, None)  # a missing corpus downloads here, before anything is yielded
        if first is not None:
            yield first
        yield from iterator
    except InputError:
        raise
    except Exception as exc:
        raise _offline_error(ref, exc) from None


def _irds_document(doc) -> Document:
    text = getattr(doc, "text", None) or getattr(doc, "body", None) or ""
    return Document(doc.doc_id, getattr(doc, "title", "") or "", text)


def _offline_error(ref: str, exc: BaseException) -> InputError:
    """One line for a dataset that is neither local nor downloadable here (offline, or a failed download)."""
    detail = (str(exc).strip().splitlines() or [""])[0][:160]
    local = ref.removeprefix("beir/")
    return InputError(ref, f"not found locally and ir_datasets could not download it ({type(exc).__name__}: {detail}); "
                           f"offline, point $ORCHESTRATE_DATA_DIR at a directory holding '{local}/' (BEIR layout: "
                           "corpus.jsonl, queries.jsonl, qrels/<split>.tsv; or TREC topics and qrels)")


@contextmanager
def _quiet_ir_datasets() -> Iterator[None]:
    """ir_datasets logs every download attempt and retry on loggers of its own; on failure our
    one-line error says it all, so its INFO and WARNING lines are held back meanwhile."""
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(previous)


def _irds_call(ref: str, fn: Callable, *args):
    """Call into ir_datasets; anything it raises (offline downloads raise many kinds) is one clear line."""
    try:
        with _quiet_ir_datasets():
            result = fn(*args)
            return list(result) if isinstance(result, Iterator) else result
    except InputError:
        raise
    except Exception as exc:
        raise _offline_error(ref, exc) from None


def scored_documents(ref: str, split: str) -> Iterator[tuple[str, str, float]]:
    """(query id, doc id, score) of the run an ir_datasets collection ships for ``split`` (its
    ``scoreddocs``: MS MARCO document's official top-100 for train and dev), streamed; one clear
    line where it has none, or cannot be downloaded."""
    import ir_datasets

    base = ref.strip("/")
    try:
        dataset = ir_datasets.load(base)
        subset = dataset if dataset.has_qrels() else ir_datasets.load(f"{base}/{split}")
    except KeyError:
        raise InputError(ref, f"first_stage scoreddocs: no ir_datasets split '{split}' (scoreddocs needs an ir_datasets "
                              "collection)") from None
    if not subset.has_scoreddocs():
        raise InputError(ref, f"first_stage scoreddocs: split '{split}' ships no run (no scoreddocs); use bm25")
    for scored in _guarded_iter(ref, subset.scoreddocs_iter):
        yield scored.query_id, scored.doc_id, float(scored.score)


def load_ir_datasets(ref: str) -> Collection:
    """Load an ir_datasets id; for ids without qrels, their train/dev/test subsets become splits."""
    try:
        import ir_datasets
    except ImportError:
        raise InputError(f"ir_datasets:{ref}", "the ir_datasets package is not installed") from None
    try:
        dataset = ir_datasets.load(ref)
    except KeyError:
        raise InputError(ref, "unknown dataset: not a local directory, not under $ORCHESTRATE_DATA_DIR, not an ir_datasets id") from None
    subsets: dict[str, object] = {}
    if dataset.has_qrels():
        last = ref.rsplit("/", 1)[-1]
        subsets[last if last in _KNOWN_SPLITS else "test"] = dataset
    else:
        for split in _KNOWN_SPLITS:
            try:
                subsets[split] = ir_datasets.load(f"{ref}/{split}")
            except KeyError:
                continue
    if not subsets:
        raise InputError(f"ir_datasets:{ref}", "has no relevance judgements in any split")
    queries: dict[str, str] = {}
    qrels: dict[str, Qrels] = {}
    for split, subset in subsets.items():
        # materialised inside the guard: a download happens while iterating, not when asked
        for query in _irds_call(ref, subset.queries_iter):
            queries[query.query_id] = getattr(query, "text", None) or getattr(query, "title", "")
        split_qrels: Qrels = {}
        for qrel in _irds_call(ref, subset.qrels_iter):
            split_qrels.setdefault(qrel.query_id, {})[qrel.doc_id] = int(qrel.relevance)
        qrels[split] = split_qrels
    corpus = _IrdsDocs(dataset, ref) if dataset.has_docs() else None
    # The guess when nothing states it (see the module docstring): TREC-DL counts grades >= 2.
    relevance_level = 2 if "trec-dl" in ref else 1
    return Collection(name=ref, corpus=corpus, queries=queries, qrels=qrels, relevance_level=relevance_level)


def local_directory(ref: str) -> Path | None:
    """The local directory a reference names (itself, or ``$ORCHESTRATE_DATA_DIR/<name>``), or None
    when it would come from ir_datasets. Reads nothing."""
    path = Path(ref).expanduser()
    if path.is_dir():
        return path.resolve()
    root = data_dir()
    if root is not None and (root / ref.removeprefix("beir/")).is_dir():
        return (root / ref.removeprefix("beir/")).resolve()
    return None


def same_collection(first: str, second: str) -> bool:
    """Whether two references name one collection (the same local directory, or the same id)."""
    a, b = local_directory(first), local_directory(second)
    if a is not None or b is not None:
        return a == b
    return first.strip("/") == second.strip("/")


def _remembered_content_hash(local: Path, files: list[Path], create_cache: bool = False) -> str:
    """SHA-256 of these files' names and bytes, remembered in the cache per set of their sizes and
    modification times: a file is read again only when it changed. ``create_cache``: make the
    cache to remember it in (a fingerprint is asked for what will be cached anyway)."""
    stats = [(str(p.relative_to(local)), p.stat().st_size, p.stat().st_mtime_ns) for p in files]
    remembered = cache_dir() / "identity" / f"content-{stable_key(str(local), stats)}.json"
    if remembered.exists():
        return json.loads(remembered.read_text())["sha256"]
    digest = hashlib.sha256()
    for path in files:
        digest.update(str(path.relative_to(local)).encode() + b"\x00")
        with open(path, "rb") as handle:
            for block in iter(lambda handle=handle: handle.read(1 << 20), b""):
                digest.update(block)
    _remember(remembered, {"directory": str(local), "sha256": digest.hexdigest()}, create_cache)
    return digest.hexdigest()


def remembered_file_hash(path: Path) -> str:
    """SHA-256 of one file's bytes (a run file's: MS MARCO's official training run is 1.5 GB),
    remembered in the cache per (path, size, modification time): read again only when it changed."""
    path = Path(path).resolve()
    stat = path.stat()
    remembered = cache_dir() / "identity" / f"file-{stable_key(str(path), stat.st_size, stat.st_mtime_ns)}.json"
    if remembered.exists():
        return json.loads(remembered.read_text())["sha256"]
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    _remember(remembered, {"file": str(path), "sha256": digest.hexdigest()}, create_cache=True)
    return digest.hexdigest()


def _remember(path: Path, value: dict, create_cache: bool = False) -> None:
    """Write ``value`` where a cache exists (a command that only reads creates none, unless
    ``create_cache``); a read-only cache is not an error: the value is computed again next time."""
    if not create_cache and not cache_dir().is_dir():
        return
    temporary = path.with_suffix(f".{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary.write_text(json.dumps(value))
        temporary.replace(path)
    except OSError:
        temporary.unlink(missing_ok=True)


def corpus_fingerprint(local: Path | None, ref: str) -> str:
    """The identity of a collection's corpus alone, without reading it where it can be avoided:
    the content hash of a directory's corpus files (remembered, :func:`_remembered_content_hash`),
    or an ir_datasets corpus's id (collections that share a corpus, such as msmarco-document and
    its TREC-DL subsets, share it, so their index is built once; ir_datasets versions a changed
    corpus under a new id, so a library upgrade rebuilds nothing)."""
    if local is None:
        import ir_datasets

        return stable_key("ir_datasets-docs", ir_datasets.docs_parent_id(ref.strip("/")))
    corpus_files = [p for p in (local / "corpus.jsonl", local / "corpus.jsonl.gz") if p.is_file()]
    files = corpus_files or sorted(p for p in local.rglob("*") if p.is_file()  # WikiQA: built from all its files
                                   and not any(part.startswith(".") for part in p.relative_to(local).parts))
    return _remembered_content_hash(local, files, create_cache=True)[:16]


def collection_identity(ref: str) -> str:
    """What a collection's results depend on, without loading it: for a local directory, the
    content of its files (hashed once per set of file sizes and modification times, and
    remembered in the cache), with the identity of a corpus its ``collection.yaml`` names; for
    an ir_datasets id, the id and the ir_datasets version (its files are versioned by the
    library). Stored with results, it tells whether they describe today's data."""
    local = local_directory(ref)
    if local is None:
        try:
            import ir_datasets

            version = ir_datasets.__version__
        except ImportError:
            version = "?"
        return stable_key("ir_datasets", ref.strip("/"), version)
    files = sorted(p for p in local.rglob("*") if p.is_file()
                   and not any(part.startswith(".") for part in p.relative_to(local).parts))
    digest = _remembered_content_hash(local, files)
    parts = [digest]
    properties = local / COLLECTION_FILE
    if properties.is_file():
        corpus = (read_collection_file(properties).get("corpus") or "")
        if corpus:
            parts.append(collection_identity(str(local / corpus) if (local / corpus).is_dir() else corpus))
    identity = stable_key(*parts)
    return identity


_OPENED: dict[tuple, Collection] = {}  # per process: a collection is read once, whoever asks


def _files_signature(local: Path) -> tuple:
    """The sizes and modification times of a directory's files (stat calls only): what says the
    copy in memory is still the one on disk."""
    files = sorted(p for p in local.rglob("*") if p.is_file()
                   and not any(part.startswith(".") for part in p.relative_to(local).parts))
    return tuple((str(p.relative_to(local)), p.stat().st_size, p.stat().st_mtime_ns) for p in files)


def resolve_collection(ref: str) -> Collection:
    """Resolve a reference: a local directory, ``$ORCHESTRATE_DATA_DIR/<name>``, else ir_datasets.

    Opened once per process (again only when a local directory's files change): a trial's
    preparation, its targets and the sweep's cells ask for the same collections many times."""
    local = local_directory(ref)
    if local is None and ref.startswith(("/", ".", "~")):
        raise InputError(ref, "no such directory")
    opened_as = (ref, str(local), _files_signature(local)) if local is not None else (ref.strip("/"),)
    if opened_as not in _OPENED:
        collection = _load_directory(local, ref) if local is not None else load_ir_datasets(ref)
        if collection.corpus is not None and collection._fingerprint is None:  # computed when first asked
            collection._fingerprint_of = partial(corpus_fingerprint, local, ref)  # picklable
        _OPENED[opened_as] = collection
    return _OPENED[opened_as]


COLLECTION_FILE = "collection.yaml"
_COLLECTION_KEYS = {"relevance_level", "corpus"}


def read_collection_file(path: Path) -> dict:
    """The properties a directory's ``collection.yaml`` states (see the module docstring)."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise InputError(path, f"cannot read ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise InputError(path, "expected a mapping (relevance_level, corpus)")
    unknown = sorted(set(data) - _COLLECTION_KEYS)
    if unknown:
        raise InputError(path, f"{unknown[0]}: unknown key (known: {', '.join(sorted(_COLLECTION_KEYS))})")
    level = data.get("relevance_level")
    if level is not None and (not isinstance(level, int) or isinstance(level, bool) or level < 1):
        raise InputError(path, f"relevance_level must be an integer >= 1, got {level!r}")
    corpus = data.get("corpus")
    if corpus is not None and not isinstance(corpus, str):
        raise InputError(path, f"corpus must be a collection reference (text), got {corpus!r}")
    return data


def _load_directory(path: Path, name: str) -> Collection:
    properties = read_collection_file(path / COLLECTION_FILE) if (path / COLLECTION_FILE).is_file() else {}
    if _first_existing(path / "corpus.jsonl", path / "corpus.jsonl.gz"):
        collection = load_beir_directory(path, name)
    elif (path / WIKIQA_TEST_FILE).exists():
        collection = load_wikiqa_directory(path, name)
    elif any(path.glob("topics*")) and any(path.glob("qrels*")):
        collection = load_trec_directory(path, name)
    else:
        raise InputError(path, "neither a BEIR directory (corpus.jsonl, queries.jsonl, qrels/), TREC topics and qrels, "
                               "nor the WikiQA files")
    if properties.get("relevance_level") is not None:
        collection.relevance_level = properties["relevance_level"]
    if properties.get("corpus"):
        if collection.corpus is not None:
            raise InputError(path / COLLECTION_FILE, "corpus: this directory has a corpus of its own")
        reference = properties["corpus"]
        relative = path / reference
        owner = resolve_collection(str(relative) if relative.is_dir() else reference)
        collection.corpus, collection._fingerprint_of = owner.require_corpus(), partial(getattr, owner, "fingerprint")
    return collection
