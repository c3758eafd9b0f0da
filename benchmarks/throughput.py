"""Training and scoring pairs/s of one worker on this machine: the CPU profile of the dry run's
compute estimate (``orchestrator/sweep/estimate.py``), measured the way a trial computes.

    python benchmarks/throughput.py [--threads 1] [--model minilm-l6] [--max-length 128]

Trains one epoch of a SciFact training set (no augmentation) with our loop in this process and
scores SciFact (query, BM25 candidate) pairs with our scorer, each after an untimed warm-up,
under ``precision: auto``, with ``--threads`` torch threads (a trial's worker gets
``cpus_per_worker``: the demo's is 1). Writes the JSON and a profile file that
``orchestrate sweep FILE --dry-run --throughput FILE --device NAME`` reads.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--model", default="minilm-l6")
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--pairs", type=int, default=320, help="training pairs (the epoch timed)")
    parser.add_argument("--score-pairs", type=int, default=2048)
    parser.add_argument("--name", default="cpu-here", help="the profile's name")
    parser.add_argument("--out", default=str(RESULTS / "throughput.json"))
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    import yaml

    torch.set_num_threads(args.threads)
    from benchmarks._in_process import train_in_process
    from benchmarks._results import write_results
    from workloads.kinds.rerank.spec import TrialSpec
    from workloads.kinds.rerank.steps import prepare_trial
    from workloads.models.cross_encoder import CrossEncoder, autocast_dtype, score_pairs

    def spec(pairs: int) -> TrialSpec:
        return TrialSpec.model_validate({
            "name": "throughput", "data": {"collection": "beir/scifact", "validation_queries": 5},
            "first_stage": {"train_depth": 50, "validation_depth": 5, "test_depth": 10},
            "training_data": {"size": pairs, "seed": 13}, "model": {"name": args.model, "max_length": args.max_length},
            "optimization": {"epochs": 1, "batch_size": 16, "eval_batch_size": 32},
        })

    train_in_process(spec(64), prepare_trial(spec(64)).training)  # warm-up: allocator, kernels
    epochs, _ = train_in_process(spec(args.pairs), prepare_trial(spec(args.pairs)).training)
    train_rate = args.pairs / epochs[0]["epoch_train_seconds"]

    import pyarrow.parquet as pq

    rows = pq.read_table(prepare_trial(spec(args.pairs)).training.training_set).to_pylist()
    queries = [row["query"] for row in rows for _ in (0, 1)]
    documents = [text for row in rows for text in (row["positive"], row["negative"])]
    queries, documents = (queries * (args.score_pairs // len(queries) + 1))[:args.score_pairs], \
        (documents * (args.score_pairs // len(documents) + 1))[:args.score_pairs]
    model = CrossEncoder.from_pretrained(args.model, args.max_length)
    score_pairs(model, queries[:128], documents[:128], 32, torch.device("cpu"))  # warm-up
    started = time.perf_counter()
    score_pairs(model, queries, documents, 32, torch.device("cpu"))
    score_rate = args.score_pairs / (time.perf_counter() - started)
    precision = str(autocast_dtype(torch.device("cpu"), "auto") or torch.float32)
    profile = {args.name: {"model": args.model, "tokens": args.max_length, "cpus": args.threads,
                           "train_pairs_per_second": round(train_rate, 1), "score_pairs_per_second": round(score_rate, 1),
                           "source": f"benchmarks/throughput.py here ({args.threads} thread(s), {precision})"}}
    print(f"{args.model} at {args.max_length} tokens, {args.threads} thread(s), {precision}: training {train_rate:.1f} "
          f"pairs/s, scoring {score_rate:.1f} pairs/s")
    write_results(args.out, args, profile=profile)
    profile_file = Path(args.out).with_suffix(".profile.yaml")
    profile_file.write_text(yaml.safe_dump(profile, sort_keys=False))
    print(f"written: {profile_file} (orchestrate sweep FILE --dry-run --throughput {profile_file} --device {args.name})")


if __name__ == "__main__":
    main()
