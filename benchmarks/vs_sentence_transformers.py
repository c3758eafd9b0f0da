"""Training and scoring throughput: our cross-encoder vs sentence-transformers', side by side.

The field's standard trainer is sentence-transformers' ``CrossEncoderTrainer`` with
``BinaryCrossEntropyLoss`` (and ``CrossEncoder.predict`` for scoring). Both sides get, in one
process, the same model (MiniLM-L6 by default), the same pairs (our training set of each
configuration, every (q, d+) and (q, d-) of it), the same batch size, max length, torch
threads and device. Ours is the real training loop (``workloads.training.train_cross_encoder``,
one epoch, pointwise BCE, its own ``epoch_train_seconds``) and the real scorer
(``workloads.models.cross_encoder.score_pairs``), at ``precision: auto`` (bf16 autocast where it
is measured faster than fp32 on this CPU, else fp32), at fp32, and with length-bucketed
batches (``optimization.length_bucketing``); and, to show what fusing the optimizer step
gained, with torch's multi-tensor AdamW (what the loop used before). sentence-transformers
runs at its defaults (fp32; transformers' Trainer fuses AdamW by default) and at its best
setting here (training: ``bf16=True``, autocast; scoring: bf16 weights). Each configuration
starts with one untimed training run of ours (the first run of a configuration is slower).

Configurations: SciFact (long abstracts, BM25 negatives) and WikiQA (short sentences, the
given lists) at 128 and 256 tokens. Prints a table (pairs/s and ratios) and writes JSON.

MFU (model FLOPs utilization): training does ~6 N FLOP per token and scoring ~2 N, N the
model's parameters outside its embedding tables (attention's own products are left out, so
MFU slightly understates the work); tokens are the pairs' real tokens, not padding. The
denominator is ``--peak-tflops`` where given (a GPU's datasheet peak in the precision used);
otherwise the rate this device reaches on the model's largest matrix product (its
feed-forward up-projection over 2,048 tokens) in the precision our side runs in: a CPU VM's
nominal peak is not published, and this is the ceiling its matrix kernels actually reach.
On a shared VM that rate moves (110-332 GFLOP/s in one day on the README's 2-core Xeon):
pass ``--peak-tflops`` for a fixed denominator (there, 0.294: its nominal fp32 peak).

    pip install -e '.[bench]'
    ORCHESTRATE_DATA_DIR=/path/to/data python benchmarks/vs_sentence_transformers.py \
        [--train-pairs 160] [--score-pairs 512] [--threads 2] [--device cpu] [--peak-tflops T] \
        [--out benchmarks/results/vs_sentence_transformers.json]

On a GPU (``--device cuda``), the issue's configuration is BERT-base at 512 tokens in bf16:
``--model <local BERT-base directory> --lengths 512 --peak-tflops 989`` (H100 SXM, dense bf16).
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _in_process import train_in_process  # noqa: E402  (benchmarks/ is sys.path[0])
from _results import write_results  # noqa: E402

DATASETS = {
    "scifact": {"data": {"collection": "beir/scifact", "validation_queries": 5},
                "first_stage": {"train_depth": 50, "validation_depth": 5, "test_depth": 5}},
    "wikiqa": {"data": {"collection": "wikiqa", "train_split": "train", "validation_split": "dev", "validation_queries": 5},
               "first_stage": {"method": "given", "train_depth": 100, "validation_depth": 5, "test_depth": 5}},
}


def trial_spec(dataset: str, max_length: int, pairs: int, batch_size: int, precision: str, model: str):
    from workloads.kinds.rerank.spec import TrialSpec

    return TrialSpec.model_validate({
        "name": f"bench-{dataset}-{max_length}", "seed": 13, **DATASETS[dataset],
        "training_data": {"size": pairs, "seed": 13}, "model": {"name": model, "max_length": max_length},
        "optimization": {"epochs": 1, "batch_size": batch_size, "learning_rate": 2e-5, "precision": precision,
                         "eval_batch_size": 64},
    })


def training_pairs(parquet: str) -> tuple[list[str], list[str], list[float]]:
    import pyarrow.parquet as pq

    queries, documents, labels = [], [], []
    for row in pq.read_table(parquet).to_pylist():
        for text, label in ((row["positive"], 1.0), (row["negative"], 0.0)):
            queries.append(row["query"])
            documents.append(text)
            labels.append(label)
    return queries, documents, labels


def multi_tensor_adamw(groups, **options):
    """torch's default (multi-tensor) AdamW: what our loop used before it fused the step."""
    import torch

    return torch.optim.AdamW(groups, foreach=True, **options)


def with_optimization(spec, **changes):
    return spec.model_copy(update={"optimization": spec.optimization.model_copy(update=changes)})


def ours_training(spec, prepared, device) -> float:
    """Pairs/s of our training loop (its own clock: the steps, not validation)."""
    epochs, _ = train_in_process(spec, prepared.training, device)
    steps_pairs = (spec.training_data.size // spec.optimization.batch_size) * spec.optimization.batch_size
    return steps_pairs / epochs[0]["epoch_train_seconds"]


def st_model(path: str, max_length: int, device: str, bf16_weights: bool = False):
    import torch
    from sentence_transformers.cross_encoder import CrossEncoder

    model = CrossEncoder(path, num_labels=1, max_length=max_length, device=device)
    return model.to(torch.bfloat16) if bf16_weights else model


def st_training(path: str, max_length: int, pairs: tuple, batch_size: int, bf16: bool, device: str) -> float:
    """Pairs/s of CrossEncoderTrainer + BinaryCrossEntropyLoss (its ``train_runtime``)."""
    from datasets import Dataset
    from sentence_transformers.cross_encoder import CrossEncoderTrainer, CrossEncoderTrainingArguments
    from sentence_transformers.cross_encoder.losses import BinaryCrossEntropyLoss

    queries, documents, labels = pairs
    usable = len(labels) // batch_size * batch_size  # whole batches, as ours (which drops the last)
    dataset = Dataset.from_dict({"query": queries[:usable], "document": documents[:usable], "label": labels[:usable]})
    model = st_model(path, max_length, device)
    with tempfile.TemporaryDirectory() as out:
        args = CrossEncoderTrainingArguments(
            output_dir=out, per_device_train_batch_size=batch_size, num_train_epochs=1, learning_rate=2e-5,
            warmup_ratio=0.1, bf16=bf16, use_cpu=device == "cpu", save_strategy="no", report_to="none", logging_steps=10_000,
            disable_tqdm=True, seed=13, dataloader_drop_last=True)
        trainer = CrossEncoderTrainer(model=model, args=args, train_dataset=dataset, loss=BinaryCrossEntropyLoss(model))
        output = trainer.train()
    return usable / output.metrics["train_runtime"]


def non_embedding_parameters(model) -> int:
    """N of MFU's FLOP count: the cross-encoder's parameters (encoder and score head) outside
    the encoder's embedding tables (token, position, segment), as Kaplan et al. (2020) count."""
    encoder = model.encoder
    embeddings = getattr(encoder, "embeddings", None) or encoder.get_input_embeddings()
    excluded = {id(p) for p in embeddings.parameters()}
    return sum(p.numel() for p in model.parameters() if id(p) not in excluded)


def real_tokens_per_pair(model, queries: list[str], documents: list[str]) -> float:
    """Mean tokens per pair after truncation to the model's max length, padding excluded."""
    total = 0
    for start in range(0, len(queries), 256):
        pairs = model.encode(queries[start:start + 256], documents[start:start + 256])
        total += int(pairs.inputs["attention_mask"].sum())
    return total / len(queries)


def matrix_product_flops(hidden: int, intermediate: int, dtype, device) -> float:
    """FLOP/s of the model's feed-forward up-projection on ``device`` in ``dtype`` at the
    current thread count: the product ``precision: auto`` times (see the module docstring: MFU)."""
    from workloads.models.cross_encoder import MATMUL_REPEATS, MATMUL_ROWS, _matmul_seconds

    flop = MATMUL_REPEATS * 2 * MATMUL_ROWS * hidden * intermediate
    return flop / _matmul_seconds(dtype, hidden, intermediate, device)


def timed(function, *args, **kwargs) -> float:
    started = time.perf_counter()
    function(*args, **kwargs)
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="minilm-l6")
    parser.add_argument("--train-pairs", type=int, default=160, help="training pairs per run (whole batches)")
    parser.add_argument("--score-pairs", type=int, default=512, help="pairs scored per run")
    parser.add_argument("--batch-size", type=int, default=16, help="training pairs per step, both sides")
    parser.add_argument("--score-batch-size", type=int, default=64, help="pairs per scoring batch, both sides")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--datasets", default="scifact,wikiqa")
    parser.add_argument("--lengths", default="128,256")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="MFU's denominator (a GPU's datasheet peak); default: the measured rate of the "
                             "model's largest matrix product on this device")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "vs_sentence_transformers.json"))
    args = parser.parse_args()

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    from workloads import training
    from workloads.kinds.rerank.steps import prepare_trial
    from workloads.models.cross_encoder import CrossEncoder, autocast_dtype, resolve_model_name, score_pairs

    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.threads)
    path = resolve_model_name(args.model)
    device = torch.device(args.device)
    auto = autocast_dtype(device, "auto")
    probe = CrossEncoder.from_pretrained(path, 128)
    parameters = non_embedding_parameters(probe)
    config = probe.encoder.config
    del probe

    def measured_peak() -> float:  # noise only slows a product down: the best of two moments is kept
        return matrix_product_flops(config.hidden_size, config.intermediate_size, auto or torch.float32, device)

    if args.peak_tflops:
        peak, peak_source = args.peak_tflops * 1e12, "--peak-tflops"
    else:
        peak = measured_peak()
        peak_source = (f"measured: {config.hidden_size} x {config.intermediate_size} product over 2,048 tokens "
                       f"in {auto or torch.float32}, the best of before and after the runs")
    rows = []
    for dataset in args.datasets.split(","):
        for max_length in (int(n) for n in args.lengths.split(",")):
            spec = trial_spec(dataset, max_length, args.train_pairs, args.batch_size, "auto", args.model)
            prepared = prepare_trial(spec)
            pairs = training_pairs(prepared.training.training_set)
            row = {"dataset": dataset, "max_length": max_length}
            # one untimed run first: the first training run of a configuration came out slower
            # than the same run repeated (in all four, by up to 22%), whichever side runs it
            ours_training(spec, prepared, device)
            # training: ours (auto, fp32) and theirs (defaults, bf16), alternating
            row["train_ours_auto"] = ours_training(spec, prepared, device)
            row["train_st_default"] = st_training(path, max_length, pairs, args.batch_size, False, args.device)
            row["train_ours_fp32"] = ours_training(with_optimization(spec, precision="fp32"), prepared, device)
            row["train_st_bf16"] = st_training(path, max_length, pairs, args.batch_size, True, args.device)
            row["train_ours_bucketed"] = ours_training(with_optimization(spec, length_bucketing=True), prepared, device)
            with mock.patch.object(training, "adamw", multi_tensor_adamw):  # the loop before its fused AdamW
                row["train_ours_multi_tensor_adamw"] = ours_training(spec, prepared, device)
            # scoring the same pairs (repeated to --score-pairs)
            n = args.score_pairs
            queries = (pairs[0] * (n // len(pairs[0]) + 1))[:n]
            documents = (pairs[1] * (n // len(pairs[1]) + 1))[:n]
            ours = CrossEncoder.from_pretrained(path, max_length).to(device)
            theirs = st_model(path, max_length, args.device)
            theirs_bf16 = st_model(path, max_length, args.device, bf16_weights=True)
            batch = args.score_batch_size

            # one-time kernel set-up, both sides, untimed
            score_pairs(ours, queries[:batch], documents[:batch], batch, device, precision="auto")
            for model in (theirs, theirs_bf16):
                model.predict(list(zip(queries[:batch], documents[:batch])), batch_size=batch, show_progress_bar=False)
            row["score_ours_auto"] = n / timed(score_pairs, ours, queries, documents, batch, device, precision="auto")
            row["score_st_default"] = n / timed(theirs.predict, list(zip(queries, documents)), batch_size=batch,
                                                show_progress_bar=False)
            row["score_ours_fp32"] = n / timed(score_pairs, ours, queries, documents, batch, device, precision="fp32")
            row["score_st_bf16"] = n / timed(theirs_bf16.predict, list(zip(queries, documents)), batch_size=batch,
                                             show_progress_bar=False)
            for kind in ("train", "score"):
                theirs_best = max(row[f"{kind}_st_default"], row[f"{kind}_st_bf16"])
                row[f"{kind}_ratio_vs_default"] = row[f"{kind}_ours_auto"] / row[f"{kind}_st_default"]
                row[f"{kind}_ratio_vs_best"] = row[f"{kind}_ours_auto"] / theirs_best
            row["train_bucketed_ratio_vs_default"] = row["train_ours_bucketed"] / row["train_st_default"]
            row["train_bucketed_ratio_vs_best"] = row["train_ours_bucketed"] / max(row["train_st_default"], row["train_st_bf16"])
            row["train_tokens_per_pair"] = real_tokens_per_pair(ours, *pairs[:2])
            row["score_tokens_per_pair"] = real_tokens_per_pair(ours, queries, documents)
            rows.append(row)
            print(f"{dataset} {max_length}: train {row['train_ours_auto']:.1f} vs {row['train_st_default']:.1f} pairs/s, "
                  f"score {row['score_ours_auto']:.1f} vs {row['score_st_default']:.1f}", flush=True)

    if not args.peak_tflops:
        peak = max(peak, measured_peak())
    for row in rows:
        for kind, flop_per_token in (("train", 6), ("score", 2)):
            for side in ("ours_auto", "st_default"):
                row[f"{kind}_{side}_mfu"] = (flop_per_token * parameters * row[f"{kind}_tokens_per_pair"]
                                             * row[f"{kind}_{side}"] / peak)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU {platform.processor() or platform.machine()}"
    print(f"\nmodel {args.model} ({parameters:,} non-embedding parameters), batch {args.batch_size} (scoring "
          f"{args.score_batch_size}), {args.threads} threads, {where}, our precision auto = {auto or torch.float32}; "
          f"MFU against {peak / 1e9:,.0f} GFLOP/s ({peak_source})")
    print("training pairs/s (unfused: ours with torch's multi-tensor AdamW; x ST: ours / ST defaults; "
          "x best: ours / the faster ST setting; tok: real tokens per pair)")
    print(f"{'dataset':<9}{'len':>5}{'ours':>8}{'fp32':>8}{'bucketed':>10}{'unfused':>9}{'ST':>8}{'ST bf16':>9}{'x ST':>7}"
          f"{'x best':>8}{'bucketed x ST':>15}{'x best':>8}{'tok':>6}{'MFU ours':>10}{'MFU ST':>8}")
    for r in rows:
        print(f"{r['dataset']:<9}{r['max_length']:>5}{r['train_ours_auto']:>8.1f}{r['train_ours_fp32']:>8.1f}"
              f"{r['train_ours_bucketed']:>10.1f}{r['train_ours_multi_tensor_adamw']:>9.1f}{r['train_st_default']:>8.1f}"
              f"{r['train_st_bf16']:>9.1f}{r['train_ratio_vs_default']:>7.2f}{r['train_ratio_vs_best']:>8.2f}"
              f"{r['train_bucketed_ratio_vs_default']:>15.2f}{r['train_bucketed_ratio_vs_best']:>8.2f}"
              f"{r['train_tokens_per_pair']:>6.0f}{r['train_ours_auto_mfu']:>10.1%}{r['train_st_default_mfu']:>8.1%}")
    print("scoring pairs/s")
    print(f"{'dataset':<9}{'len':>5}{'ours':>8}{'fp32':>8}{'ST':>8}{'ST bf16':>9}{'x ST':>7}{'x best':>8}{'tok':>6}"
          f"{'MFU ours':>10}{'MFU ST':>8}")
    for r in rows:
        print(f"{r['dataset']:<9}{r['max_length']:>5}{r['score_ours_auto']:>8.1f}{r['score_ours_fp32']:>8.1f}"
              f"{r['score_st_default']:>8.1f}{r['score_st_bf16']:>9.1f}{r['score_ratio_vs_default']:>7.2f}"
              f"{r['score_ratio_vs_best']:>8.2f}{r['score_tokens_per_pair']:>6.0f}{r['score_ours_auto_mfu']:>10.1%}"
              f"{r['score_st_default_mfu']:>8.1%}")
    write_results(args.out, args, our_auto_precision=str(auto or torch.float32), torch=torch.__version__, rows=rows,
                  device=where, non_embedding_parameters=parameters, mfu_peak_flops=peak, mfu_peak_source=peak_source)
    return 0


if __name__ == "__main__":
    sys.exit(main())
