"""Pruners side by side on one real small grid: Optuna's median pruner against its Wilcoxon pruner.

``record`` trains a small grid in this process (SciFact, MiniLM-L6, a pointwise baseline cell and
an SCL cell, ``--trials`` Optuna TPE trials per cell, ``--epochs`` epochs each, the learning rate
searched over a wide log range so that some trials are poor) and keeps every epoch's validation
nDCG@10 *per query* with its seconds. ``replay`` then runs each pruner over those same trials, in
the same order (each trial's parameters enqueued), stopping a trial where the pruner says so:
every variant sees identical learning curves, so the comparison is the pruners' alone.

- ``median``: Optuna's MedianPruner on the epoch's mean (the sweep's default, 2 start-up trials);
- ``wilcoxon-P``: Optuna's WilcoxonPruner (threshold P) on the per-query values; a trial's step
  ``(epoch - 1) * queries + i`` is query ``i`` after that epoch, so the paired test compares the
  same queries at the same epochs of the current and the best trial (its start-up: one epoch).

Reported per variant: epochs trained, training seconds, the compute with a fixed per-trial
overhead (``--overhead``: a Ray trial's start-up, 19-25 s in ``sweep_cost.py``), trials pruned,
and each cell's winner against the unpruned one. A replay cannot show what a live sweep's TPE
would sample after a pruned trial; the first trials of each cell are the same either way.

    ORCHESTRATE_DATA_DIR=/path/to/data python benchmarks/pruning.py record --out /tmp/curves.json [--trials 6]
    python benchmarks/pruning.py replay /tmp/curves.json [--overhead 20]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import optuna

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _results import write_results  # noqa: E402  (benchmarks/ is sys.path[0])

CELLS = {"baseline": {"ranking": "pointwise", "contrastive": "none"},
         "scl": {"ranking": "pointwise", "contrastive": "scl"}}
VARIANTS = ("none", "median", "wilcoxon-0.1", "wilcoxon-0.05")


def suggest(trial: optuna.Trial, contrastive: str) -> dict:
    params = {"learning_rate": trial.suggest_float("learning_rate", 1e-6, 1e-3, log=True)}
    if contrastive != "none":
        params["lambda"] = trial.suggest_float("lambda", 0.1, 0.7)
    if contrastive == "scl":
        params["tau"] = trial.suggest_float("tau", 0.05, 0.5, log=True)
    return params


def spec_for(cell: str, params: dict, args):
    from workloads.kinds.rerank.spec import TrialSpec

    loss = {**CELLS[cell], **{k: v for k, v in params.items() if k != "learning_rate"}}
    return TrialSpec.model_validate({
        "name": f"pruning-{cell}", "seed": 13,
        "data": {"collection": "beir/scifact", "validation_queries": args.validation_queries},
        "first_stage": {"train_depth": 50, "validation_depth": 10, "test_depth": 5},
        "training_data": {"size": args.size}, "model": {"name": "minilm-l6", "max_length": 128}, "loss": loss,
        "optimization": {"epochs": args.epochs, "batch_size": 16, "eval_batch_size": 64,
                         "learning_rate": params["learning_rate"], "precision": "fp32"},
        "resources": {"workers": 1, "cpus_per_worker": 2},
    })


def record(args) -> None:
    """Train the grid here, keeping each epoch's per-query validation nDCG@10 (resumes a partial file)."""
    import torch

    import workloads.evaluation.reranking as reranking
    from workloads.kinds import TRIAL_KINDS

    kind = TRIAL_KINDS["rerank"]
    out = Path(args.out)
    curves = json.loads(out.read_text()) if out.exists() else {"settings": vars(args), "cells": {}}
    captured: list[dict] = []
    original = reranking.rerank_and_evaluate

    def capturing(*a, **kw):  # validation's per-query values, which the epoch's report aggregates
        result = original(*a, **kw)
        captured.append(dict(result.evaluation.per_query["ndcg_at_10"]))
        return result

    for module in list(sys.modules.values()):
        if getattr(module, "__name__", "").startswith("workloads") and getattr(module, "rerank_and_evaluate", None) is original:
            module.rerank_and_evaluate = capturing
    for cell, loss in CELLS.items():
        trials = curves["cells"].setdefault(cell, [])
        study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=13))
        for done in trials:  # a resumed recording tells the sampler what it already saw
            trial = study.ask()
            suggest(trial, loss["contrastive"])
            study.tell(trial, max(e["val_ndcg_at_10"] for e in done["epochs"]))
        while len(trials) < args.trials:
            trial = study.ask()
            params = suggest(trial, loss["contrastive"])
            spec = spec_for(cell, params, args)
            prepared = kind.prepare(spec)
            epochs: list[dict] = []
            captured.clear()
            stamps = [time.perf_counter()]

            def report(metrics, checkpoint, epochs=epochs, stamps=stamps):
                stamps.append(time.perf_counter())
                epochs.append({"epoch": int(metrics["epoch"]), "val_ndcg_at_10": metrics["val_ndcg_at_10"],
                               "seconds": stamps[-1] - stamps[-2], "per_query": captured[-1]})

            torch.manual_seed(0)
            kind.train(spec, kind.worker_inputs(prepared), report)
            study.tell(trial, max(e["val_ndcg_at_10"] for e in epochs))
            trials.append({"params": params, "epochs": epochs})
            out.write_text(json.dumps(curves))
            print(cell, len(trials), params, [round(e["val_ndcg_at_10"], 4) for e in epochs], flush=True)


def make_pruner(variant: str, queries: int) -> optuna.pruners.BasePruner:
    if variant == "none":
        return optuna.pruners.NopPruner()
    if variant == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=0)
    return optuna.pruners.WilcoxonPruner(p_threshold=float(variant.split("-")[1]), n_startup_steps=queries)


def replay_cell(trials: list[dict], variant: str) -> dict:
    queries = sorted(trials[0]["epochs"][0]["per_query"])
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=13),
                                pruner=make_pruner(variant, len(queries)))
    outcome = []
    for index, recorded in enumerate(trials):
        study.enqueue_trial(recorded["params"])
        trial = study.ask()
        for name, value in recorded["params"].items():  # the enqueued value is what these return
            trial.suggest_float(name, value, value)
        ran = 0
        for epoch in recorded["epochs"]:
            ran += 1
            if variant.startswith("wilcoxon"):
                for i, query in enumerate(queries):
                    trial.report(epoch["per_query"][query], (epoch["epoch"] - 1) * len(queries) + i)
            else:
                trial.report(epoch["val_ndcg_at_10"], epoch["epoch"])
            if ran < len(recorded["epochs"]) and trial.should_prune():
                break
        pruned = ran < len(recorded["epochs"])
        value = max(e["val_ndcg_at_10"] for e in recorded["epochs"][:ran])
        study.tell(trial, state=optuna.trial.TrialState.PRUNED) if pruned else study.tell(trial, value)
        outcome.append({"trial": index, "epochs": ran, "pruned": pruned, "value": value,
                        "seconds": sum(e["seconds"] for e in recorded["epochs"][:ran])})
    best = max((o for o in outcome if not o["pruned"]), key=lambda o: o["value"])
    return {"trials": outcome, "winner": best["trial"], "winner_value": best["value"]}


def replay(args) -> None:
    curves = json.loads(Path(args.curves).read_text())
    rows = {}
    for variant in VARIANTS:
        cells = {cell: replay_cell(trials, variant) for cell, trials in curves["cells"].items() if trials}
        outcomes = [o for c in cells.values() for o in c["trials"]]
        rows[variant] = {"cells": cells, "trials": len(outcomes), "pruned": sum(o["pruned"] for o in outcomes),
                         "epochs": sum(o["epochs"] for o in outcomes), "train_seconds": sum(o["seconds"] for o in outcomes)}
        rows[variant]["compute_seconds"] = rows[variant]["train_seconds"] + args.overhead * len(outcomes)
    base = rows["none"]
    print(f"{'pruner':14s} {'pruned':>7s} {'epochs':>7s} {'train s':>8s} {'compute':>8s}  winners (val nDCG@10), changed")
    for variant, row in rows.items():
        row["compute_ratio"] = row["compute_seconds"] / base["compute_seconds"]
        row["winners_changed"] = [c for c in row["cells"] if row["cells"][c]["winner"] != base["cells"][c]["winner"]]
        winners = ", ".join(f"{c} {row['cells'][c]['winner_value']:.4f}" for c in row["cells"])
        print(f"{variant:14s} {row['pruned']:3d}/{row['trials']:<3d} {row['epochs']:7d} {row['train_seconds']:8.0f} "
              f"{row['compute_ratio']:7.2f}x  {winners}; changed: {row['winners_changed'] or 'none'}")
    write_results(args.out, args, variants=rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("--out", required=True)
    rec.add_argument("--trials", type=int, default=6)
    rec.add_argument("--epochs", type=int, default=3)
    rec.add_argument("--size", type=int, default=100)
    rec.add_argument("--validation-queries", type=int, default=50)
    rep = sub.add_parser("replay")
    rep.add_argument("curves")
    rep.add_argument("--overhead", type=float, default=20.0, help="seconds a trial costs before its first epoch")
    rep.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "pruning.json"))
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)  # WilcoxonPruner's
    record(args) if args.command == "record" else replay(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
