"""Open a collection from its reference, once per process.

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

from functools import partial
from pathlib import Path

from workloads.core.errors import InputError
from workloads.data.collections import Collection
from workloads.data.identity import corpus_fingerprint, files_signature, local_directory
from workloads.data.irds import load_ir_datasets
from workloads.data.local_files import load_beir_directory, load_trec_directory
from workloads.data.readers import COLLECTION_FILE, first_existing, read_collection_file
from workloads.data.wikiqa import WIKIQA_TEST_FILE, load_wikiqa_directory

_OPENED: dict[tuple, Collection] = {}  # per process: a collection is read once, whoever asks


def resolve_collection(ref: str) -> Collection:
    """Resolve a reference: a local directory, ``$ORCHESTRATE_DATA_DIR/<name>``, else ir_datasets.

    Opened once per process (again only when a local directory's files change): a trial's
    preparation, its targets and the sweep's cells ask for the same collections many times."""
    local = local_directory(ref)
    if local is None and ref.startswith(("/", ".", "~")):
        raise InputError(ref, "no such directory")
    opened_as = (ref, str(local), files_signature(local)) if local is not None else (ref.strip("/"),)
    if opened_as not in _OPENED:
        collection = _load_directory(local, ref) if local is not None else load_ir_datasets(ref)
        if collection.corpus is not None and collection._fingerprint is None:  # computed when first asked
            collection._fingerprint_of = partial(corpus_fingerprint, local, ref)  # picklable
        _OPENED[opened_as] = collection
    return _OPENED[opened_as]


def _load_directory(path: Path, name: str) -> Collection:
    properties = read_collection_file(path / COLLECTION_FILE) if (path / COLLECTION_FILE).is_file() else {}
    if first_existing(path / "corpus.jsonl", path / "corpus.jsonl.gz"):
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
