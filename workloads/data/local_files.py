"""Collections in local files: a BEIR directory (its corpus read through the document store)
and TREC topics and qrels (a directory with one of each, or the two files)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from workloads.core.errors import InputError
from workloads.core.paths import cache_dir
from workloads.data.collections import Collection
from workloads.data.docstore import STORE_VERSION, DocStore, build_docstore
from workloads.data.document import Document
from workloads.data.identity import corpus_fingerprint
from workloads.data.readers import first_existing, read_beir_queries, read_jsonl, read_qrels, read_trec_topics


def _beir_records(path: Path) -> Iterator[tuple[str, str, str]]:
    """(doc id, title, text) of a BEIR corpus file, streamed."""
    for record in read_jsonl(path, ("_id", "text")):
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


def load_beir_directory(path: Path, name: str | None = None) -> Collection:
    path = Path(path)
    corpus_file = first_existing(path / "corpus.jsonl", path / "corpus.jsonl.gz")
    if corpus_file is None:
        raise InputError(path, "not a BEIR directory: no corpus.jsonl or corpus.jsonl.gz")
    queries_file = first_existing(path / "queries.jsonl", path / "queries.jsonl.gz")
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
