"""``optimization.compile`` measured: our training loop and scorer, eager vs ``torch.compile``.

Side by side in one process, the same trial (MiniLM-L6 by default, the same pairs, batch,
max length, threads): the real training loop (``workloads.training.train_cross_encoder``,
two epochs, so the second shows the compiled steady state; its own ``epoch_train_seconds``;
compiled twice: inductor's on-disk cache empty, as for a machine's first compiled trial, then
warm, as for every later one)
and the real scorer (``score_pairs``: the first batch, which compiles, timed apart from the
rest). Also each variant's validation nDCG@10 after the last epoch (it must not move) and the
trial's wall time. Prints a table and writes JSON.

    ORCHESTRATE_DATA_DIR=/path/to/data python benchmarks/torch_compile.py \
        [--train-pairs 160] [--score-pairs 512] [--threads 2] [--out benchmarks/results/torch_compile.json]
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _in_process import train_in_process  # noqa: E402  (benchmarks/ is sys.path[0])
from _results import write_results  # noqa: E402
from vs_sentence_transformers import training_pairs, trial_spec, with_optimization  # noqa: E402


def training(spec, prepared) -> dict:
    """Per-epoch pairs/s, the trial's wall time and its last validation nDCG@10."""
    from workloads.evaluation import PRIMARY_METRIC

    epochs, wall = train_in_process(spec, prepared.training)
    pairs = (spec.training_data.size // spec.optimization.batch_size) * spec.optimization.batch_size
    return {"pairs_per_s": [pairs / e["epoch_train_seconds"] for e in epochs], "wall_s": wall,
            "val_ndcg10": epochs[-1]["val_" + PRIMARY_METRIC]}


def scoring(model, queries: list[str], documents: list[str], batch: int) -> dict:
    """Seconds of the first batch (kernel set-up; compiling) and pairs/s of the rest."""
    import torch

    from workloads.models.cross_encoder import score_pairs

    cpu = torch.device("cpu")
    started = time.perf_counter()
    score_pairs(model, queries[:batch], documents[:batch], batch, cpu, precision="fp32")
    first = time.perf_counter() - started
    started = time.perf_counter()
    score_pairs(model, queries, documents, batch, cpu, precision="fp32")
    return {"first_batch_s": first, "pairs_per_s": len(queries) / (time.perf_counter() - started)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="minilm-l6")
    parser.add_argument("--train-pairs", type=int, default=160, help="training pairs per epoch (whole batches)")
    parser.add_argument("--score-pairs", type=int, default=512, help="pairs scored per run")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--score-batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--configs", default="scifact:128,scifact:256,wikiqa:128", help="dataset:max_length, ...")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "torch_compile.json"))
    args = parser.parse_args()

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    from workloads.kinds.rerank.steps import prepare_trial
    from workloads.models.cross_encoder import CrossEncoder, compile_encoder, require_compiler, resolve_model_name

    require_compiler()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.threads)
    rows = []
    for config in args.configs.split(","):
        dataset, max_length = config.split(":")[0], int(config.split(":")[1])
        spec = trial_spec(dataset, max_length, args.train_pairs, args.batch_size, "fp32", args.model)
        spec = with_optimization(spec, epochs=2)
        prepared = prepare_trial(spec)
        row: dict = {"dataset": dataset, "max_length": max_length}
        row["train_eager"] = training(spec, prepared)
        # a machine's first compiled trial (inductor's on-disk cache empty), then a later one (the
        # cache warm, as for every further trial on the machine; dynamo's in-memory graphs dropped)
        inductor_cache = os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor-")
        torch._dynamo.reset()
        row["train_compiled"] = training(with_optimization(spec, compile=True), prepared)
        torch._dynamo.reset()
        row["train_compiled_warm"] = training(with_optimization(spec, compile=True), prepared)
        pairs = training_pairs(prepared.training.training_set)
        n = args.score_pairs
        queries, documents = (pairs[0] * (n // len(pairs[0]) + 1))[:n], (pairs[1] * (n // len(pairs[1]) + 1))[:n]
        path = resolve_model_name(args.model)
        eager = CrossEncoder.from_pretrained(path, max_length)
        compiled = CrossEncoder.from_pretrained(path, max_length)
        compile_encoder(compiled)
        row["score_eager"] = scoring(eager, queries, documents, args.score_batch_size)
        torch._dynamo.reset()  # the validation of the trials above compiled this graph; count it (warm cache)
        row["score_compiled"] = scoring(compiled, queries, documents, args.score_batch_size)
        torch._dynamo.reset()
        shutil.rmtree(inductor_cache, ignore_errors=True)
        row["train_ratio_steady"] = row["train_compiled"]["pairs_per_s"][-1] / row["train_eager"]["pairs_per_s"][-1]
        row["score_ratio_steady"] = row["score_compiled"]["pairs_per_s"] / row["score_eager"]["pairs_per_s"]
        row["trial_wall_ratio"] = row["train_compiled"]["wall_s"] / row["train_eager"]["wall_s"]
        row["trial_wall_ratio_warm"] = row["train_compiled_warm"]["wall_s"] / row["train_eager"]["wall_s"]
        rows.append(row)
        print(f"{dataset} {max_length}: training epoch 2 x{row['train_ratio_steady']:.2f}, scoring x"
              f"{row['score_ratio_steady']:.2f}, trial wall x{row['trial_wall_ratio']:.2f} (warm cache "
              f"x{row['trial_wall_ratio_warm']:.2f})", flush=True)

    print(f"\nmodel {args.model}, batch {args.batch_size} (scoring {args.score_batch_size}), {args.threads} threads, "
          f"fp32, CPU {platform.processor() or platform.machine()}, torch {torch.__version__}")
    print("training pairs/s per epoch (epoch 1 includes compiling), trial wall s (2 epochs + validation; compiled: "
          "inductor's cache cold, then warm), val nDCG@10")
    print(f"{'dataset':<9}{'len':>5}{'eager e1':>10}{'e2':>7}{'compiled e1':>13}{'e2':>7}{'x e2':>7}"
          f"{'wall eager':>12}{'cold':>7}{'warm':>7}{'val eager':>11}{'compiled':>10}")
    for r in rows:
        e, c, w = r["train_eager"], r["train_compiled"], r["train_compiled_warm"]
        print(f"{r['dataset']:<9}{r['max_length']:>5}{e['pairs_per_s'][0]:>10.1f}{e['pairs_per_s'][-1]:>7.1f}"
              f"{c['pairs_per_s'][0]:>13.1f}{c['pairs_per_s'][-1]:>7.1f}{r['train_ratio_steady']:>7.2f}"
              f"{e['wall_s']:>12.1f}{c['wall_s']:>7.1f}{w['wall_s']:>7.1f}{e['val_ndcg10']:>11.4f}{c['val_ndcg10']:>10.4f}")
    print("scoring: first batch s (compiling, inductor's cache warm) and pairs/s of the rest")
    print(f"{'dataset':<9}{'len':>5}{'eager 1st':>11}{'pairs/s':>9}{'compiled 1st':>14}{'pairs/s':>9}{'x':>7}")
    for r in rows:
        e, c = r["score_eager"], r["score_compiled"]
        print(f"{r['dataset']:<9}{r['max_length']:>5}{e['first_batch_s']:>11.1f}{e['pairs_per_s']:>9.1f}"
              f"{c['first_batch_s']:>14.1f}{c['pairs_per_s']:>9.1f}{r['score_ratio_steady']:>7.2f}")
    write_results(args.out, args, torch=torch.__version__, rows=rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
