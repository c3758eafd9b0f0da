"""``orchestrate augment``: a trial's augmentations next to the documents they come from (AUG Table 2)."""

from __future__ import annotations

import argparse
import textwrap

from orchestrator.cli.output import HelpFormatter, bounded, emit
from orchestrator.cli.run import selected_trials
from workloads.core.errors import InputError


def add_parser(sub, common) -> None:
    parser = sub.add_parser("augment", help="build (or reuse) a trial's augmentations and show examples", parents=[common],
                            formatter_class=HelpFormatter)
    parser.add_argument("config", help="trial YAML with augmentation")
    parser.add_argument("--trial", help="only this trial of a multi-trial file")
    parser.add_argument("--show", type=bounded(int, 0, what="a number of examples"), default=3, help="examples to print")
    parser.add_argument("--chars", type=bounded(int, 1, what="a number of characters"), default=600,
                        help="characters of the original document shown")
    parser.add_argument("--width", type=bounded(int, 40, what="an output width"), default=120, help="output width")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import pyarrow.parquet as pq

    from workloads.kinds.rerank.steps import prepare_trial

    _, specs = selected_trials(args)
    specs = [s for s in specs if getattr(s, "augmentation", None) is not None and s.augmentation.method != "none"]
    if not specs:
        raise InputError(args.config, "no trial with augmentation (augmentation.method is none)")
    for spec in specs:
        prepared = prepare_trial(spec)
        rows = pq.read_table(prepared.training.training_set).to_pylist()
        augmented = pq.read_table(prepared.training.augmentation_for(1)).to_pylist()
        emit(f"== {spec.name}: {spec.augmentation.method}, k_a = {spec.augmentation.k}, {len(augmented)} rows "
             f"({prepared.training.augmentation_for(1)})")
        width = max(40, (args.width - 7) // 2)
        for row, aug in list(zip(rows, augmented))[: args.show]:
            emit(f"\nquery: {row['query']}")
            original = textwrap.wrap(row["positive"][:args.chars] + ("..." if len(row["positive"]) > args.chars else ""), width)
            selected = textwrap.wrap(aug["augmented_positive"] or "(no sentence: no augmented pair)", width)
            emit(f"{'original d+ (' + row['positive_id'] + ')':<{width}} | augmented d+_a "
                 f"({aug['sentences_kept']} of {aug['sentences_total']} sentences)")
            for i in range(max(len(original), len(selected))):
                left = original[i] if i < len(original) else ""
                right = selected[i] if i < len(selected) else ""
                emit(f"{left:<{width}} | {right}")
    return 0
