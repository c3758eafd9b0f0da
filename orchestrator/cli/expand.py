"""``orchestrate expand``: how much expanded queries can do for BM25 on a collection split, before
any reranker is trained (EAR's headroom)."""

from __future__ import annotations

import argparse
import json

from orchestrator.cli.output import HelpFormatter, bounded, emit, metrics_table
from workloads.core.errors import InputError
from workloads.evaluation import PRIMARY_METRIC, RETRIEVAL_MEASURES, evaluate

MAX_DEPTH = 1000  # as an EAR trial's ear.depth


def add_parser(sub, common) -> None:
    parser = sub.add_parser("expand", help="expansions of a split's queries and what BM25 does with them: the first, all "
                                           "concatenated, the oracle's best (EAR's headroom), beside BM25 and RM3",
                            parents=[common], formatter_class=HelpFormatter)
    parser.add_argument("--dataset", required=True, help="beir/<name>, a directory, or an ir_datasets id")
    parser.add_argument("--split", default="test", help="the split whose queries are expanded and judged")
    parser.add_argument("--source", default="pseudo_relevance", help="pseudo_relevance, generator or file")
    parser.add_argument("--path", help="--source file: a JSONL of {query_id, expansion}")
    parser.add_argument("--model", help="--source generator: a Hugging Face id or directory (seq2seq or causal)")
    parser.add_argument("--prompt", default="{query}", help="--source generator: its input, {query} the query's text")
    parser.add_argument("--temperature", type=bounded(float, 1e-6, what="a sampling temperature (> 0)"), default=1.0,
                        help="--source generator: the sampling temperature")
    parser.add_argument("--n", type=bounded(int, 1, 200, what="expansions per query"), default=20, help="expansions per query")
    parser.add_argument("--seed", type=int, default=0, help="the draws of pseudo_relevance")
    parser.add_argument("--depth", type=bounded(int, 1, MAX_DEPTH, what="hits per query"), default=100,
                        help="hits per query (measures with a deeper cutoff are not reported)")
    parser.add_argument("--ear", metavar="FILE", action="append", default=[],
                        help="an EAR trial file (kind: ear) whose kept reranker chooses among these expansions too, "
                             "trained elsewhere (zero-shot on another collection); repeatable")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from workloads.data.resolve import resolve_collection
    from workloads.evaluation.significance import paired_test
    from workloads.kinds.ear.comparison import LABELS
    from workloads.kinds.ear.retrieval import SYSTEMS, unchosen_systems
    from workloads.kinds.ear.sources import expansions
    from workloads.spec import ExpansionSpec

    try:
        spec = ExpansionSpec(source=args.source, n=args.n, seed=args.seed, path=args.path, model=args.model,
                             prompt=args.prompt, temperature=args.temperature)
    except ValidationError as exc:
        error = exc.errors()[0]
        raise InputError("--source" if error["loc"] else "expand", error["msg"].removeprefix("Value error, ")) from None
    trials = ear_trials(args.ear)  # every file named on the command line, known good before any search
    measures = measures_within(args.depth)
    collection = resolve_collection(args.dataset)
    queries = collection.split_queries(args.split)
    qrels = collection.split_qrels(args.split)
    expanded = expansions(collection, queries, spec)
    runs = unchosen_systems(collection, queries, expanded, qrels, collection.relevance_level, args.depth)
    evaluations = {name: evaluate(runs[name], qrels, collection.relevance_level, measures) for name in SYSTEMS}
    labels = dict(LABELS)
    for trial in trials:  # each kept EAR reranker's choice, beside the oracle's
        from workloads.kinds.ear.steps import transferred_choice

        name = f"ear-{trial.ear.reranker}:{trial.name}"
        labels[name] = f"EAR-{trial.ear.reranker.upper()} ({trial.name})"
        chosen = transferred_choice(trial, collection, args.split, queries, qrels, spec, args.depth)
        evaluations[name] = evaluate(chosen, qrels, collection.relevance_level, measures)
    order = [n for n in SYSTEMS if n != "oracle"] + [n for n in evaluations if n not in SYSTEMS] + ["oracle"]
    evaluations = {name: evaluations[name] for name in order}
    p_values = {name: paired_test(evaluations[name].per_query["ndcg_at_10"], evaluations["bm25"].per_query["ndcg_at_10"]).p_value
                for name in evaluations if name != "bm25"}
    if args.json:
        emit(json.dumps({"dataset": args.dataset, "split": args.split, "expansion": spec.model_dump(), "depth": args.depth,
                         "queries": evaluations["bm25"].num_queries,
                         "systems": {name: {"metrics": evaluations[name].aggregate, "p_value_vs_bm25": p_values.get(name)}
                                     for name in evaluations},
                         "example": {qid: expanded[qid][:3] for qid in list(queries)[:2]}}, indent=2))
        return 0
    drawn = f" (seed {spec.seed})" if spec.source in SEEDED_SOURCES else ""  # a file's expansions are drawn by no seed
    emit(f"{args.dataset} {args.split}: {evaluations['bm25'].num_queries} queries, {spec.n} {spec.source} expansions each"
         f"{drawn}, BM25 top-{args.depth}")
    emit(metrics_table([(labels[name], evaluations[name].aggregate) for name in evaluations]))
    emit("nDCG@10 against BM25 (paired t-test): " + ", ".join(f"{labels[n]} p={p:.3g}" for n, p in p_values.items()))
    headroom = evaluations["oracle"].aggregate["ndcg_at_10"] - evaluations["bm25"].aggregate["ndcg_at_10"]
    emit(f"headroom of choosing an expansion (oracle - BM25, nDCG@10): {headroom:+.4f}")
    return 0


SEEDED_SOURCES = ("pseudo_relevance", "generator")


def measures_within(depth: int) -> tuple[str, ...]:
    """The retrieval measures a top-``depth`` run supports: none whose cutoff is deeper (R@100 of
    a top-20 run is R@20), but nDCG@10, which the comparison is made in, always."""
    def cutoff(name: str) -> int:
        _, at, number = name.rpartition("_at_")
        return int(number) if at else 0

    return tuple(m for m in RETRIEVAL_MEASURES if m == PRIMARY_METRIC or cutoff(m) <= depth)


def ear_trials(paths: list[str]) -> list:
    """The EAR trials of ``--ear``, each read and found trained (one line naming the option otherwise)."""
    from workloads.kinds.ear.spec import ear_dir, load_ear_trial, trained_ear

    trials = []
    for path in paths:
        try:
            trial = load_ear_trial(path)
        except InputError as exc:
            raise InputError(f"--ear {path}", exc.problem.removeprefix("first_stage run: ")) from None
        if trained_ear(trial) is None:
            raise InputError(f"--ear {path}", f"EAR trial {trial.name} is not trained yet ({ear_dir(trial)}): "
                                              f"`orchestrate run {path}` trains it")
        trials.append(trial)
    return trials
