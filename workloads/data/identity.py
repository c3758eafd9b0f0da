"""What a collection's results depend on, without loading it: where a reference lives
(:func:`local_directory`), and the identity of its files or its corpus, remembered in the cache
per set of file sizes and modification times so no process reads a corpus again for it."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from workloads.core.paths import cache_dir, data_dir, stable_key
from workloads.data.readers import COLLECTION_FILE, read_collection_file


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



def collection_found(ref: str) -> bool:
    """Whether a reference names data on this machine: a local directory (itself, or under
    ``$ORCHESTRATE_DATA_DIR``), or an ir_datasets id whose files ir_datasets keeps here. When not,
    its :func:`collection_identity` is not that of the data results were recorded on (a local
    collection seen from a shell without ``$ORCHESTRATE_DATA_DIR`` looks like an ir_datasets id),
    so nothing can be said about whether that data changed."""
    if local_directory(ref) is not None:
        return True
    if ref.startswith(("/", ".", "~")):
        return False
    # ir_datasets' home (ir_datasets.util.home_path), read here: importing ir_datasets costs seconds
    home = Path(os.environ.get("IR_DATASETS_HOME") or "~/.ir_datasets").expanduser()
    return (home / ref.strip("/").split("/")[0]).is_dir()

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


def files_signature(local: Path) -> tuple:
    """The sizes and modification times of a directory's files (stat calls only): what says the
    copy in memory is still the one on disk."""
    files = sorted(p for p in local.rglob("*") if p.is_file()
                   and not any(part.startswith(".") for part in p.relative_to(local).parts))
    return tuple((str(p.relative_to(local)), p.stat().st_size, p.stat().st_mtime_ns) for p in files)
