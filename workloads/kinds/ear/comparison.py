"""An EAR trial's test comparison: its chosen expansions beside the systems that need no
choice (BM25, RM3, the first expansion, all concatenated) and the oracle's best expansion,
with paired significance of nDCG@10 against BM25 and RM3 (what the method is measured by)."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow.parquet as pq

from workloads.core.errors import InputError
from workloads.evaluation import RETRIEVAL_MEASURES, Evaluation, evaluate
from workloads.evaluation.significance import paired_test
from workloads.kinds.ear.retrieval import SYSTEMS
from workloads.kinds.ear.spec import RUN_FILE, EarTrialSpec, trained_ear
from workloads.kinds.ear.steps import prepare_ear
from workloads.retrieval.bm25 import read_trec_run

LABELS = {"bm25": "BM25", "rm3": "BM25+RM3", "first": "first expansion", "concatenated": "all expansions, concatenated",
          "oracle": "oracle (best expansion)"}


@dataclass(frozen=True)
class ComparedSystem:
    name: str            # bm25, rm3, first, concatenated, ear-ri / ear-rd, oracle
    label: str
    evaluation: Evaluation
    p_vs_bm25: float | None
    p_vs_rm3: float | None


def ear_test_evaluation(spec: EarTrialSpec, prepared) -> Evaluation:
    """The kept EAR run on the trial's test queries (the same ranking its test step evaluated)."""
    kept = trained_ear(spec)
    if kept is None:
        raise InputError(spec.name, "EAR trial not trained yet: `orchestrate run` trains it")
    test_ids = set(pq.read_table(prepared.splits["test"].rows, columns=["query_id"]).column("query_id").to_pylist())
    run = {qid: ranking for qid, ranking in read_trec_run(kept / RUN_FILE).items() if qid in test_ids}
    return evaluate(run, prepared.test_qrels, prepared.test_relevance_level, RETRIEVAL_MEASURES)


def ear_comparison(spec: EarTrialSpec) -> list[ComparedSystem]:
    """The rows of the comparison, in the method's order: the unchosen systems, EAR, the oracle."""
    prepared = prepare_ear(spec)  # cached: read back
    evaluations = dict(prepared.systems)
    ear = f"ear-{spec.ear.reranker}"
    evaluations[ear] = ear_test_evaluation(spec, prepared)
    labels = {**LABELS, ear: f"EAR-{spec.ear.reranker.upper()}"}
    order = [name for name in SYSTEMS if name != "oracle"] + [ear, "oracle"]

    def p(name: str, baseline: str) -> float | None:
        if name == baseline:
            return None
        return paired_test(evaluations[name].per_query["ndcg_at_10"], evaluations[baseline].per_query["ndcg_at_10"]).p_value

    return [ComparedSystem(name, labels[name], evaluations[name], p(name, "bm25"), p(name, "rm3")) for name in order]


__all__ = ["ComparedSystem", "LABELS", "ear_comparison", "ear_test_evaluation"]
