"""``orchestrate perturb``: a split's queries next to their perturbed variants (CFT's robustness sets)."""

from __future__ import annotations

import argparse

from orchestrator.cli.output import HelpFormatter, bounded, emit
from workloads.core.errors import InputError
from workloads.text.perturbations import PERTURBATIONS, perturb_queries


def add_parser(sub, common) -> None:
    parser = sub.add_parser("perturb", help="a split's queries and their perturbed variants side by side", parents=[common],
                            formatter_class=HelpFormatter)
    parser.add_argument("dataset", help="a collection reference, e.g. wikiqa or beir/scifact")
    parser.add_argument("--split", default="test", help="the split whose queries are perturbed")
    parser.add_argument("--show", type=bounded(int, 0, what="a number of queries"), default=5, help="queries to print")
    parser.add_argument("--perturbations", help="comma-separated (default: every one: punctuation,typo,contraction)")
    parser.add_argument("--seed", type=int, default=0, help="the perturbation seed (0: what trials use)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from workloads.data.resolve import resolve_collection

    names = args.perturbations.split(",") if args.perturbations else list(PERTURBATIONS)
    unknown = [n for n in names if n not in PERTURBATIONS]
    if unknown:
        raise InputError("--perturbations", f"unknown perturbation '{unknown[0]}' (known: {', '.join(PERTURBATIONS)})")
    queries = resolve_collection(args.dataset).split_queries(args.split)
    variants = {name: perturb_queries(queries, name, args.seed) for name in names}
    emit(f"{args.dataset} {args.split}: {len(queries)} queries; variants: "
         + ", ".join(f"{name} {len(v)}" for name, v in variants.items()))
    for qid in list(queries)[: args.show]:
        emit(f"\n{qid}  original     {queries[qid]}")
        for name in names:
            emit(f"{'':{len(qid)}}  {name:<12} {variants[name].get(qid, '(no variant)')}")
    return 0
