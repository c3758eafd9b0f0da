"""The dense and hybrid first stages: what a bi-encoder retrieves, alone or fused with BM25.

``first_stage: {method: dense, run: <dense trial file>}`` retrieves with the encoder a dense
trial kept (the trial is a requirement: trained first); ``{method: dense, model: <id or
path>}`` with an off-the-shelf encoder (``minilm-l6``, a Hugging Face id, a local directory;
pooling and normalisation as its sentence-transformers configuration declares). The corpus
is encoded once per (encoder, corpus) content into a store (:mod:`.store`) and searched with
faiss (:mod:`.index`: exact flat inner product, or HNSW above ``hnsw_threshold`` documents
with ``dense_index: auto``, or as asked).

``method: hybrid`` fuses that dense run with BM25 (``k1``, ``b``, ``index``) at the same
depth (:mod:`.hybrid`): ``fusion: rrf`` (``rrf_k``) or ``fusion: interpolation`` with
``fusion_weight`` given, or tuned (nDCG@10 over a grid) on the judged queries of the
collection's training split, never on the split being retrieved.

Each writes its run as a TREC file in the cache, keyed by content (the encoder's identity, the
corpus, the queries, the depth, the search), and returns its path, like every first stage.
"""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

from workloads.core.errors import InputError, RequirementNotTrained
from workloads.core.logs import get_logger
from workloads.core.paths import cache_dir, stable_key
from workloads.data.collections import Collection
from workloads.data.identity import remembered_file_hash
from workloads.evaluation.ranking import TIE_ORDER
from workloads.kinds.dense.hybrid import RRF_K, interpolate_runs, reciprocal_rank_fusion, tune_fusion_weight
from workloads.kinds.dense.index import HNSW_THRESHOLD, HNSWParams, chosen_method, search_store
from workloads.kinds.dense.store import corpus_store
from workloads.retrieval.bm25 import read_trec_run, write_trec_run
from workloads.retrieval.first_stage import FirstStageMethod

Run = dict[str, dict[str, float]]
PRECISION = "fp32"  # the stored embeddings and the runs are those of fp32 (one identity whatever the machine)
TUNING_QUERIES = 500  # at most this many training queries tune a hybrid's interpolation weight
TUNING_SEED = 13


class DenseNotTrained(RequirementNotTrained):
    """A first stage reads a dense trial that has not finished yet."""


def _option(fs, name: str, default):
    return getattr(fs, name, default) if getattr(fs, name, None) is not None else default


def check_encoder_options(fs, where: str = "first_stage") -> None:
    """One line unless exactly one of ``run`` (a dense trial file) and ``model`` is given."""
    run, model = getattr(fs, "run", None), getattr(fs, "model", None)
    if bool(run) == bool(model):
        raise InputError(where, f"method '{fs.method}' needs one of run (a dense trial file) or model (an encoder: "
                                "a Hugging Face id, a local path or minilm-l6), not " + ("both" if run else "neither"))


def dense_trial(fs):
    """The dense trial a first stage reads (``run``), or None for an off-the-shelf ``model``."""
    if not getattr(fs, "run", None):
        return None
    from workloads.kinds.dense.spec import load_dense_trial

    return load_dense_trial(fs.run)


def dense_requires(fs) -> list:
    trial = dense_trial(fs)
    return [trial] if trial is not None else []


def dense_identity(fs) -> str | None:
    """The required trial's key, keyed into a reading trial's identity instead of the file's path."""
    trial = dense_trial(fs)
    if trial is None:
        return None
    from workloads.kinds.dense.spec import dense_key

    return f"dense-{dense_key(trial)}"


def model_files_identity(name: str) -> str:
    """Content identity of an off-the-shelf encoder: the hashes of its directory's files (remembered
    per file size and time), so the run cache is found without loading the model."""
    from workloads.models.cross_encoder import require_model_available, resolve_model_name

    require_model_available(name, "first_stage.model")
    path = Path(resolve_model_name(name)).expanduser()
    if not path.is_dir():  # a Hugging Face id in the local cache
        from huggingface_hub import snapshot_download

        path = Path(snapshot_download(str(path), local_files_only=True))
    digest = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        digest.update(f"{file.relative_to(path)}\x1f{remembered_file_hash(file)}\x1e".encode())
    return digest.hexdigest()[:32]


def encoder_source(fs) -> tuple[str, str]:
    """(where the encoder loads from, its content identity) for a dense first stage."""
    check_encoder_options(fs)
    trial = dense_trial(fs)
    if trial is None:
        return fs.model, model_files_identity(fs.model)
    from workloads.kinds.dense.spec import MODEL_DIR, dense_dir, dense_key, trained_dense

    kept = trained_dense(trial)
    if kept is None:
        raise DenseNotTrained(fs.run, f"dense trial {trial.name} is not trained yet ({dense_dir(trial)}): `orchestrate run` "
                                      "and `orchestrate sweep` train it first")
    return str(kept / MODEL_DIR), f"trial-{dense_key(trial)}"


def inference_device():
    import torch

    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def retrieve_dense(collection: Collection, queries: dict[str, str], k: int, source: str, identity: str,
                   index: str = "auto", threshold: int = HNSW_THRESHOLD, batch_size: int = 64, encoder=None) -> Path:
    """The top ``k`` documents of each query under the encoder at ``source`` (content ``identity``), cached;
    ``encoder``: that encoder already loaded (a miner's, called per chunk of queries)."""
    key = stable_key(identity, collection.fingerprint, sorted(queries.items()), k, index, threshold, HNSWParams(), PRECISION,
                     TIE_ORDER)
    path = cache_dir() / "runs" / f"dense-{key}.trec"
    if path.exists():
        return path
    from workloads.kinds.dense.encoder import BiEncoder

    device = inference_device()
    encoder = (encoder or BiEncoder.from_pretrained(source)).to(device)
    store = corpus_store(encoder, collection, precision=PRECISION, batch_size=batch_size, device=device)
    method = chosen_method(index, store.rows, threshold)
    query_ids = list(queries)
    embedded = encoder.encode_queries([queries[q] for q in query_ids], batch_size=batch_size, precision=PRECISION, device=device)
    run = search_store(store, query_ids, embedded, k, method, threshold)
    run = {qid: docs for qid, docs in run.items() if docs}
    write_trec_run(run, path, "dense")
    get_logger("first-stage").info(f"dense ({method}) {_found(run, k, store.rows)}")
    return path


def _found(run: dict[str, dict], k: int, rows: int) -> str:
    """What a dense search found, in words: the documents each query got (fewer than ``k`` when
    the collection has fewer), not the depth that was asked."""
    counts = [len(docs) for docs in run.values()]
    if not counts:
        return f"retrieved nothing from {rows:,} documents"
    each = f"{min(counts):,}" if min(counts) == max(counts) else f"{min(counts):,}-{max(counts):,}"
    asked = f" ({k:,} asked)" if max(counts) < k else ""
    return f"retrieved {each} of {rows:,} documents per query{asked} for {len(run):,} queries"


def dense(collection: Collection, split: str, queries: dict[str, str], k: int, fs) -> Path:
    """``first_stage.method: dense`` (the registry's signature)."""
    source, identity = encoder_source(fs)
    return retrieve_dense(collection, queries, k, source, identity, _option(fs, "dense_index", "auto"),
                          _option(fs, "hnsw_threshold", HNSW_THRESHOLD))


def _bm25(collection: Collection, split: str, queries: dict[str, str], k: int, fs) -> Path:
    from workloads.retrieval.bm25 import BM25Params, retrieved_run

    return retrieved_run(collection, queries, k=k, params=BM25Params(k1=fs.k1, b=fs.b), index=fs.index)


def tuning_queries(collection: Collection, split: str) -> dict[str, str]:
    """The judged queries a hybrid tunes its weight on: a fixed sample of the training split's."""
    if "train" not in collection.splits:
        raise InputError(collection.name, "hybrid interpolation tunes its weight on the 'train' split's queries and this "
                                          "collection has none: give first_stage.fusion_weight, or fusion: rrf")
    queries = collection.split_queries("train")
    chosen = sorted(random.Random(TUNING_SEED).sample(sorted(queries), min(TUNING_QUERIES, len(queries))))
    return {q: queries[q] for q in chosen}


def hybrid(collection: Collection, split: str, queries: dict[str, str], k: int, fs) -> Path:
    """``first_stage.method: hybrid``: the dense run fused with BM25's, both at depth ``k``."""
    source, identity = encoder_source(fs)
    index, threshold = _option(fs, "dense_index", "auto"), _option(fs, "hnsw_threshold", HNSW_THRESHOLD)
    fusion = _option(fs, "fusion", "rrf")
    if fusion == "interpolation" and getattr(fs, "fusion_weight", None) is None:
        tuning_queries(collection, split)  # fails now, before anything is encoded, where there is nothing to tune on
    dense_path = retrieve_dense(collection, queries, k, source, identity, index, threshold)
    lexical_path = _bm25(collection, split, queries, k, fs)
    if fusion == "rrf":
        rrf_k = _option(fs, "rrf_k", RRF_K)
        parts: tuple = ("rrf", rrf_k)
        make = lambda: reciprocal_rank_fusion([read_trec_run(dense_path), read_trec_run(lexical_path)], k, rrf_k)  # noqa: E731
    elif fusion == "interpolation":
        weight = getattr(fs, "fusion_weight", None)
        if weight is None:
            weight = _tuned_weight(collection, split, k, fs, source, identity, index, threshold)
        parts = ("interpolation", weight)
        make = lambda: interpolate_runs(read_trec_run(dense_path), read_trec_run(lexical_path), weight, k)  # noqa: E731
    else:
        raise InputError("first_stage.fusion", f"unknown fusion '{fusion}' (choose from rrf, interpolation)")
    path = cache_dir() / "runs" / f"hybrid-{stable_key(dense_path.stem, lexical_path.stem, parts, k, TIE_ORDER)}.trec"
    if not path.exists():
        write_trec_run(make(), path, "hybrid")
    return path


def _tuned_weight(collection: Collection, split: str, k: int, fs, source: str, identity: str, index: str, threshold: int) -> float:
    tuning = tuning_queries(collection, split)
    dense_run = read_trec_run(retrieve_dense(collection, tuning, k, source, identity, index, threshold))
    lexical_run = read_trec_run(_bm25(collection, "train", tuning, k, fs))
    qrels = collection.split_qrels("train")
    weight, value = tune_fusion_weight(dense_run, lexical_run, {q: qrels[q] for q in tuning}, collection.relevance_level, k)
    get_logger("first-stage").info(f"hybrid: dense weight {weight:.2f} tuned on {len(tuning)} training queries "
                                   f"(nDCG@10 {value:.4f})")
    return weight


def _check(fs, collection: str, split: str, where: str) -> None:
    """Before anything runs: one encoder source, and an off-the-shelf one that loads here. A dense
    trial of other data may serve any collection (zero-shot): its encoder embeds any text."""
    check_encoder_options(fs, f"{where}.method")
    if getattr(fs, "model", None):
        from workloads.models.cross_encoder import require_model_available

        require_model_available(fs.model, f"{where}.model")


def _hybrid_preflight(fs, collection: str, split: str, where: str) -> None:
    """A weight to tune where there is nothing to tune it on (a zero-shot collection without a
    train split), found by the dry run, not only by prepare."""
    if _option(fs, "fusion", "rrf") == "interpolation" and getattr(fs, "fusion_weight", None) is None:
        from workloads.data.resolve import resolve_collection

        tuning_queries(resolve_collection(collection), split)


_DENSE_FIELDS = {"run": "a dense trial file", "model": "an off-the-shelf encoder", "dense_index": "flat, hnsw or auto",
                 "hnsw_threshold": "documents above which auto searches HNSW"}
DENSE_FIRST_STAGE = FirstStageMethod("dense", dense, "dense", fields=_DENSE_FIELDS, requires=dense_requires,
                                     identity=dense_identity, check=_check)
HYBRID_FIRST_STAGE = FirstStageMethod(
    "hybrid", hybrid, "hybrid", searches_index=True, requires=dense_requires, identity=dense_identity, check=_check,
    preflight=_hybrid_preflight,
    fields={**_DENSE_FIELDS, "k1": "BM25's k1", "b": "BM25's b", "index": "the BM25 index searched",
            "fusion": "rrf or interpolation", "fusion_weight": "the dense run's interpolation weight (None: tuned)",
            "rrf_k": "RRF's constant"})


__all__ = ["DENSE_FIRST_STAGE", "HYBRID_FIRST_STAGE", "DenseNotTrained", "check_encoder_options", "dense", "dense_identity",
           "dense_requires", "encoder_source", "hybrid", "inference_device", "model_files_identity", "retrieve_dense",
           "tuning_queries"]
