"""Readers of a collection's text files: BEIR JSONL queries, qrels (BEIR TSV or TREC), TREC
topics and a directory's ``collection.yaml``; gzip or not, CRLF tolerated, every bad line one
clear error naming the file and line."""

from __future__ import annotations

import gzip
import io
import json
from collections.abc import Iterator
from pathlib import Path

import yaml

from workloads.core.errors import InputError
from workloads.data.collections import Qrels


def open_text(path: Path) -> io.TextIOBase:
    # newline=None turns CRLF into LF, so BEIR's CRLF qrels read like any other.
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline=None)
    return open(path, encoding="utf-8", newline=None)


def first_existing(*candidates: Path) -> Path | None:
    return next((p for p in candidates if p.exists()), None)


def read_jsonl(path: Path, required: tuple[str, ...]) -> Iterator[dict]:
    try:
        with open_text(path) as handle:
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


def read_beir_queries(path: Path) -> dict[str, str]:
    queries: dict[str, str] = {}
    for number, record in enumerate(read_jsonl(path, ("_id", "text")), 1):
        query_id = str(record["_id"])
        if query_id in queries and queries[query_id] != str(record["text"]):
            raise InputError(path, f"query '{query_id}' appears twice with different texts (record {number}): which "
                                   "text is meant? give every query one _id")
        queries[query_id] = str(record["text"])
    if not queries:
        raise InputError(path, "no queries")
    return queries


def numbered_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, line) of a text file (gzip or not, CRLF tolerated); unreadable is one clear error."""
    try:
        with open_text(path) as handle:
            yield from enumerate(handle, 1)
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise InputError(path, f"cannot read ({exc})") from None


def read_qrels(path: Path) -> Qrels:
    """BEIR TSV (``query-id corpus-id score``, header optional) or TREC (``qid Q0 docid rel``).

    Whitespace-separated, CRLF tolerated; a wrong column count or a non-integer grade is an
    error naming the line.
    """
    qrels: Qrels = {}
    for line_no, line in numbered_lines(path):
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
    for line_no, line in numbered_lines(path):
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


COLLECTION_FILE = "collection.yaml"
_COLLECTION_KEYS = {"relevance_level", "corpus"}


def read_collection_file(path: Path) -> dict:
    """The properties a directory's ``collection.yaml`` states (see :mod:`workloads.data.resolve`)."""
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
