"""The training loop's AdamW fused (one kernel per step) vs torch's multi-tensor AdamW.

Two measurements, side by side in one process: the optimizer step alone over the model's
parameters (random gradients, both optimizers over the same parameters, alternating), and
training pairs/s of our real loop (``workloads.training``, one epoch, fp32, its own
``epoch_train_seconds``) with each optimizer, alternating, ``--repeats`` times each after
one untimed warm-up run, the medians compared. transformers' Trainer (so
sentence-transformers' ``CrossEncoderTrainer``) fuses AdamW by default with torch >= 2.8;
our loop did not until this comparison.

    ORCHESTRATE_DATA_DIR=/path/to/data python benchmarks/fused_adamw.py \\
        [--configurations wikiqa:128,scifact:128] [--train-pairs 320] [--repeats 3] [--threads 2]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from pathlib import Path
from unittest import mock

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _results import write_results  # noqa: E402  (benchmarks/ is sys.path[0])
from vs_sentence_transformers import multi_tensor_adamw, ours_training, trial_spec  # noqa: E402


def step_milliseconds(model_name: str, steps: int) -> dict[str, float]:
    """Milliseconds per optimizer step over the model's parameters, each optimizer's median."""
    import torch

    from workloads.models.cross_encoder import CrossEncoder
    from workloads.training import adamw

    params = [p for p in CrossEncoder.from_pretrained(model_name, 128).parameters() if p.requires_grad]
    generator = torch.Generator().manual_seed(0)
    for p in params:
        p.grad = torch.randn(p.shape, generator=generator) * 1e-3
    optimizers = {"fused": adamw([{"params": params}], lr=1e-5), "multi_tensor": multi_tensor_adamw([{"params": params}], lr=1e-5)}
    times: dict[str, list[float]] = {name: [] for name in optimizers}
    for _ in range(3):  # state allocation, untimed
        for optimizer in optimizers.values():
            optimizer.step()
    for _ in range(steps):
        for name, optimizer in optimizers.items():
            started = time.perf_counter()
            optimizer.step()
            times[name].append((time.perf_counter() - started) * 1000)
    return {"parameters": sum(p.numel() for p in params), **{name: statistics.median(t) for name, t in times.items()}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="minilm-l6")
    parser.add_argument("--configurations", default="wikiqa:128,scifact:128", help="dataset:max_length, comma-separated")
    parser.add_argument("--train-pairs", type=int, default=320, help="training pairs per run (batch 16)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per optimizer and configuration")
    parser.add_argument("--steps", type=int, default=20, help="timed optimizer steps per optimizer")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "fused_adamw.json"))
    args = parser.parse_args()

    import torch

    from workloads import training
    from workloads.kinds.rerank.steps import prepare_trial

    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.threads)
    steps = step_milliseconds(args.model, args.steps)
    print(f"optimizer step over {steps['parameters'] / 1e6:.1f}M parameters: fused {steps['fused']:.1f} ms, "
          f"multi-tensor {steps['multi_tensor']:.1f} ms", flush=True)
    rows = []
    for configuration in args.configurations.split(","):
        dataset, max_length = configuration.split(":")
        spec = trial_spec(dataset, int(max_length), args.train_pairs, 16, "fp32", args.model)
        prepared = prepare_trial(spec)
        ours_training(spec, prepared)  # untimed: the first run of a configuration is slower
        runs: dict[str, list[float]] = {"fused": [], "multi_tensor": []}
        for _ in range(args.repeats):
            runs["fused"].append(ours_training(spec, prepared))
            with mock.patch.object(training, "adamw", multi_tensor_adamw):
                runs["multi_tensor"].append(ours_training(spec, prepared))
        row = {"dataset": dataset, "max_length": int(max_length), **{f"pairs_per_second_{k}": v for k, v in runs.items()}}
        row["ratio_of_medians"] = statistics.median(runs["fused"]) / statistics.median(runs["multi_tensor"])
        rows.append(row)
        print(f"{dataset} {max_length}: fused {[round(x, 1) for x in runs['fused']]}, "
              f"multi-tensor {[round(x, 1) for x in runs['multi_tensor']]}", flush=True)

    print(f"\nmodel {args.model}, batch 16, fp32, {args.threads} threads, {args.train_pairs} pairs per run, "
          f"{args.repeats} runs each (training pairs/s: median, range)")
    print(f"{'dataset':<9}{'len':>5}{'fused':>8}{'range':>13}{'multi-tensor':>14}{'range':>13}{'ratio':>7}")
    for r in rows:
        fused, multi = r["pairs_per_second_fused"], r["pairs_per_second_multi_tensor"]
        print(f"{r['dataset']:<9}{r['max_length']:>5}{statistics.median(fused):>8.1f}{min(fused):>7.1f}-{max(fused):<5.1f}"
              f"{statistics.median(multi):>14.1f}{min(multi):>7.1f}-{max(multi):<5.1f}{r['ratio_of_medians']:>7.2f}")
    write_results(args.out, args, optimizer_step_ms=steps, torch=torch.__version__, rows=rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
