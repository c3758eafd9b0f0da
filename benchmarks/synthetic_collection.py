"""An MS MARCO-shaped synthetic collection in BEIR layout, deterministic by seed.

    python benchmarks/synthetic_collection.py 200000 /tmp/synthetic-200k [--seed 13]

Documents: lengths in words drawn from a log-normal fitted to MS MARCO document's body
lengths (median ~600 words, a long tail cut at 20,000; ``--mean-words`` rescales it), words
from a Zipfian vocabulary (exponent 1.07 over GloVe's frequency-ordered words when
``$ORCHESTRATE_DATA_DIR/glove`` holds them, so the GloVe augmenter sees real words; else
made-up words), in sentences of 8-30 words, with a title of 3-10 words on 9 documents in 10.

Queries: each is 3-6 words of its relevant document (rarer words more likely, as a
searcher's are), one relevant document per query (MS MARCO's sparse judgements):
``train`` (``--train-queries``), ``dev`` and ``test`` splits, the same counts at every
corpus size, so what a trial costs can be compared across sizes.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import time
from pathlib import Path

import numpy as np

MEDIAN_WORDS = 600.0   # MS MARCO document: body lengths' median is a few hundred to a thousand words
SIGMA = 0.9            # and a long tail (mean ~1.5x the median)
MAX_WORDS = 20_000
ZIPF_EXPONENT = 1.07


def vocabulary(size: int, rng: np.random.Generator) -> np.ndarray:
    """GloVe's most frequent words where the data directory has them, else made-up words."""
    root = os.environ.get("ORCHESTRATE_DATA_DIR")
    glove = next(iter(sorted(Path(root, "glove").glob("*.txt.gz"))), None) if root and Path(root, "glove").is_dir() else None
    if glove is not None:
        words = []
        with gzip.open(glove, "rt", encoding="utf-8") as lines:
            for line in lines:
                word = line.split(" ", 1)[0]
                if word.isalpha():  # punctuation "words" would make odd sentences
                    words.append(word)
                if len(words) == size:
                    break
        return np.array(words, dtype=object)
    syllables = np.array(["ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "be", "do", "fu", "gi", "ha", "je", "pu", "zo"])
    lengths = rng.integers(1, 5, size)
    return np.array(["".join(rng.choice(syllables, n)) + str(i % 7 or "") for i, n in enumerate(lengths)], dtype=object)


def generate(count: int, out: Path, seed: int, train_queries: int, dev_queries: int, test_queries: int,
             mean_words: float | None, vocabulary_size: int) -> dict:
    rng = np.random.default_rng(seed)
    words = vocabulary(vocabulary_size, rng)
    ranks = np.arange(1, len(words) + 1)
    probabilities = ranks ** -ZIPF_EXPONENT
    probabilities /= probabilities.sum()
    cumulative = np.cumsum(probabilities)
    median = MEDIAN_WORDS * (mean_words / (MEDIAN_WORDS * np.exp(SIGMA ** 2 / 2)) if mean_words else 1.0)
    lengths = np.clip(rng.lognormal(np.log(median), SIGMA, count).astype(int), 20, MAX_WORDS)
    judged = rng.choice(count, size=train_queries + dev_queries + test_queries, replace=False)
    judged_rows = {int(row): index for index, row in enumerate(judged)}
    queries: list[str | None] = [None] * len(judged)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with open(out / "corpus.jsonl", "w", encoding="utf-8") as corpus:
        for row in range(count):
            drawn = np.searchsorted(cumulative, rng.random(int(lengths[row])))
            drawn = np.minimum(drawn, len(words) - 1)
            text_words = words[drawn]
            cuts = np.cumsum(rng.integers(8, 31, len(text_words) // 8 + 1))
            sentences = [" ".join(text_words[start:end]) for start, end in zip(np.r_[0, cuts], cuts) if start < len(text_words)]
            text = " ".join(f"{s[0].upper()}{s[1:]}." for s in sentences if s)
            title = " ".join(words[np.minimum(np.searchsorted(cumulative, rng.random(rng.integers(3, 11))), len(words) - 1)])
            title = title.capitalize() if rng.random() < 0.9 else ""
            corpus.write(json.dumps({"_id": f"D{row}", "title": title, "text": text}) + "\n")
            if row in judged_rows:  # a query of 3-6 of its words, rarer words likelier (weight ~ rank)
                weights = drawn.astype(float) + 1.0
                chosen = rng.choice(len(drawn), size=min(int(rng.integers(3, 7)), len(drawn)), replace=False,
                                    p=weights / weights.sum())
                queries[judged_rows[row]] = " ".join(text_words[chosen])
            if row and row % 100_000 == 0:
                print(f"  {row:,} documents ({time.perf_counter() - started:.0f}s)", flush=True)
    splits = {"train": range(0, train_queries), "dev": range(train_queries, train_queries + dev_queries),
              "test": range(train_queries + dev_queries, len(judged))}
    with open(out / "queries.jsonl", "w", encoding="utf-8") as handle:
        for index, text in enumerate(queries):
            handle.write(json.dumps({"_id": f"Q{index}", "text": text}) + "\n")
    (out / "qrels").mkdir(exist_ok=True)
    for split, indexes in splits.items():
        with open(out / "qrels" / f"{split}.tsv", "w", encoding="utf-8") as handle:
            handle.write("query-id\tcorpus-id\tscore\n")
            for index in indexes:
                handle.write(f"Q{index}\tD{int(judged[index])}\t1\n")
    size = (out / "corpus.jsonl").stat().st_size
    return {"documents": count, "mean_words": float(lengths.mean()), "median_words": float(np.median(lengths)),
            "corpus_bytes": size, "queries": {s: len(r) for s, r in splits.items()},
            "seconds": round(time.perf_counter() - started, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("documents", type=int)
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--train-queries", type=int, default=6000)
    parser.add_argument("--dev-queries", type=int, default=1000)
    parser.add_argument("--test-queries", type=int, default=200)
    parser.add_argument("--mean-words", type=float, default=None, help="rescale document lengths to this mean")
    parser.add_argument("--vocabulary", type=int, default=100_000)
    args = parser.parse_args()
    summary = generate(args.documents, args.out, args.seed, args.train_queries, args.dev_queries, args.test_queries,
                       args.mean_words, args.vocabulary)
    # hidden: a file of the run, not part of the collection's identity
    (args.out / ".synthetic.json").write_text(json.dumps({**vars(args), "out": str(args.out), **summary}, indent=2))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
