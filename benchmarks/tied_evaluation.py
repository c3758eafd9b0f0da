"""Measures on tied runs: what breaking ties in trec_eval's order costs, and one evaluator per weight search.

On a synthetic set of --queries queries x --docs documents whose scores tie often (a dense run
of scores rounded to 2 decimals, a BM25-like run of integer scores, graded qrels), timed as
medians of --repeats runs:

- ``evaluate``: every re-ranking measure on the lexical run through ``workloads.evaluation.evaluate``
  (ties broken in trec_eval's order, then ir_measures);
- ``ir_measures raw``: the same measures by ir_measures on the raw tied run (RR@k not trec_eval's);
- ``pytrec_eval``: trec_eval's own measures on the raw run (pytrec_eval has no RR@k: recip_rank
  stands in; it is trec_eval-exact with ties, but cannot serve RR@k, hence not the choice);
- ``fusion weight search``: ``tune_fusion_weight`` (one evaluator for its 21 weights) against
  the same search building an evaluator per weight (as before issue 58), with both answers.

    python benchmarks/tied_evaluation.py [--queries 100] [--docs 200] [--repeats 5] [--out benchmarks/results/tied_evaluation.json]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _results import write_results  # noqa: E402  (benchmarks/ is sys.path[0])


def synthetic(queries: int, docs: int, seed: int = 0):
    rng = random.Random(seed)
    dense, lexical, qrels = {}, {}, {}
    for q in range(queries):
        ids = [f"d{q}-{d}" for d in range(docs)]
        dense[f"q{q}"] = {d: round(rng.random(), 2) for d in ids}
        lexical[f"q{q}"] = {d: float(rng.randint(0, 30)) for d in ids}
        qrels[f"q{q}"] = {d: rng.choice((1, 2, 3)) for d in rng.sample(ids, 10)} | {d: 0 for d in rng.sample(ids, 5)}
    return dense, lexical, qrels


def median_seconds(call, repeats: int):
    times, result = [], None
    for _ in range(repeats):
        started = time.perf_counter()
        result = call()
        times.append(time.perf_counter() - started)
    return statistics.median(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--docs", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "tied_evaluation.json"))
    args = parser.parse_args()

    import ir_measures
    import pytrec_eval

    from workloads.evaluation import MEASURES, PRIMARY_METRIC, RERANKING_MEASURES, evaluate
    from workloads.evaluation.reranking import WEIGHT_GRID
    from workloads.kinds.dense.hybrid import interpolate_runs, tune_fusion_weight

    dense, lexical, qrels = synthetic(args.queries, args.docs)
    measures = [ir_measures.parse_measure(MEASURES[m].format(rel=1)) for m in RERANKING_MEASURES]
    trec_names = {"ndcg_cut.10", "ndcg_cut.20", "recip_rank", "map", "map_cut.20", "P.1"}

    def per_weight():  # the search as it was: an evaluator built for each weight
        best_weight, best_value = 1.0, float("-inf")
        for weight in sorted(WEIGHT_GRID, reverse=True):
            value = evaluate(interpolate_runs(dense, lexical, weight), qrels, 1, (PRIMARY_METRIC,)).aggregate[PRIMARY_METRIC]
            if value > best_value:
                best_weight, best_value = weight, value
        return best_weight, best_value

    timings = {
        "evaluate": median_seconds(lambda: evaluate(lexical, qrels, 1), args.repeats)[0],
        "ir_measures raw": median_seconds(lambda: list(ir_measures.iter_calc(measures, qrels, lexical)), args.repeats)[0],
        "pytrec_eval": median_seconds(lambda: pytrec_eval.RelevanceEvaluator(qrels, trec_names).evaluate(lexical),
                                      args.repeats)[0],
    }
    timings["fusion weight search, evaluator per weight"], before = median_seconds(per_weight, args.repeats)
    timings["fusion weight search, one evaluator"], after = median_seconds(
        lambda: tune_fusion_weight(dense, lexical, qrels, 1), args.repeats)
    print(f"{args.queries} queries x {args.docs} documents, medians of {args.repeats}")
    for name, seconds in timings.items():
        print(f"  {name:<45} {seconds:8.3f} s")
    print(f"  answers: per weight {before}, one evaluator {after}, identical: {before == after}")
    write_results(args.out, args, seconds=timings, answer_per_weight=list(before), answer_one_evaluator=list(after),
                  identical=before == after)


if __name__ == "__main__":
    main()
