"""The prebuilt indexes BM25 can search by name, read offline from the catalog bundled with Pyserini.

``first_stage.index: <name>`` hands the name to Anserini's ``SearchCollection``
(:func:`workloads.retrieval.bm25.retrieved_run`), which resolves it in the catalog inside
Pyserini's Anserini jar (``prebuilt-indexes/*.json``) and downloads it once. A name that catalog
does not hold makes Anserini print "does not appear to be a valid index" and exit 0, after a
preparation has started; :func:`check_prebuilt_index` refuses it before anything runs. Only
inverted indexes can be searched with BM25 (the catalog's impact, HNSW and flat vector indexes
cannot). Reading the catalog needs no JVM and no network.
"""

from __future__ import annotations

import difflib
import importlib.util
import json
import zipfile
from functools import cache
from pathlib import Path

from workloads.core.errors import InputError

BM25_TYPE = "inverted"


def anserini_jar() -> Path:
    """The Anserini fat jar bundled with Pyserini (its search and its prebuilt catalog)."""
    spec = importlib.util.find_spec("pyserini")
    if spec is None or not spec.submodule_search_locations:
        raise InputError("pyserini", "the pyserini package is not installed")
    jars = sorted(Path(next(iter(spec.submodule_search_locations)), "resources", "jars").glob("anserini-*-fatjar.jar"))
    if not jars:
        raise InputError("pyserini", "no bundled Anserini fat jar found in the pyserini package")
    return jars[-1]


BUILD, PREBUILT = "build", "prebuilt"


def prebuilt_index_name(reference: str) -> str:
    """Pyserini's prebuilt BM25 index of a collection: ``msmarco-v1-doc`` for MS MARCO document
    and every collection over its corpus (the TREC-DL topics), ``msmarco-v1-passage`` likewise,
    ``robust04`` for TREC Disks 4 and 5 (``disks45/nocr/...``), ``beir-v1.0.0-<name>.flat`` for
    ``beir/<name>`` (BEIR's "flat" indexes: title and text as one field, what
    :func:`workloads.retrieval.bm25.build_index` builds)."""
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


@cache
def prebuilt_catalog() -> dict[str, str]:
    """Every prebuilt index of the Anserini jar bundled with Pyserini: name -> type (inverted,
    impact, hnsw, flat)."""
    catalog: dict[str, str] = {}
    with zipfile.ZipFile(anserini_jar()) as jar:
        for member in jar.namelist():
            if member.startswith("prebuilt-indexes/") and member.endswith(".json"):
                for entry in json.loads(jar.read(member)):
                    catalog[entry["name"]] = entry.get("type", "")
    return catalog


def prebuilt_index_names() -> list[str]:
    """The prebuilt indexes BM25 can search by name (the catalog's inverted indexes), sorted."""
    return sorted(name for name, kind in prebuilt_catalog().items() if kind == BM25_TYPE)


def check_prebuilt_index(name: str, field: str = "first_stage.index") -> None:
    """Refuse (one line naming ``field``) a prebuilt index name BM25 cannot search: one the
    bundled catalog does not hold, or one that is not an inverted index."""
    catalog = prebuilt_catalog()
    kind = catalog.get(name)
    if kind == BM25_TYPE:
        return
    if kind is not None:
        raise InputError(field, f"prebuilt index '{name}' is a {kind} index, which BM25 cannot search (an inverted one "
                                "can, e.g. beir-v1.0.0-<name>.flat, msmarco-v1-doc)")
    close = difflib.get_close_matches(name, prebuilt_index_names(), n=3, cutoff=0.6)
    hint = f" (close: {', '.join(close)})" if close else ""
    raise InputError(field, f"'{name}' is not a prebuilt index of the Anserini bundled with Pyserini{hint}: give build "
                            "(index the corpus here), prebuilt (the collection's own), or one of its "
                            f"{len(prebuilt_index_names())} inverted indexes")


def check_first_stage_index(index: str, collection: str, field: str = "first_stage.index") -> None:
    """Refuse a first stage's ``index`` (``build``, ``prebuilt`` or a prebuilt index's name) that
    BM25 cannot search for ``collection``: ``prebuilt`` of a collection that has none, or that
    names one the bundled catalog does not hold, and any other name it does not hold."""
    if index == BUILD:
        return
    check_prebuilt_index(prebuilt_index_name(collection) if index == PREBUILT else index, field)


__all__ = ["BUILD", "PREBUILT", "anserini_jar", "check_first_stage_index", "check_prebuilt_index", "prebuilt_catalog",
           "prebuilt_index_name", "prebuilt_index_names"]
