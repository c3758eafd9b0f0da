"""An EAR trial's result as ``orchestrate run`` shows it: its test comparison (BM25, RM3, the
first expansion, all concatenated, EAR, the oracle) with paired t-tests against the baselines."""

from __future__ import annotations

from pathlib import Path

from workloads.kinds.ear.comparison import ear_comparison
from workloads.kinds.ear.spec import EarTrialSpec
from workloads.kinds.protocol import KindReport


def ear_report(spec: EarTrialSpec, kept: Path) -> KindReport:
    rows = ear_comparison(spec)
    queries = rows[0].evaluation.num_queries
    ear = next(r for r in rows if r.name.startswith("ear-"))
    systems = {r.name: {"metrics": r.evaluation.aggregate, "p_value_vs_bm25": r.p_vs_bm25, "p_value_vs_rm3": r.p_vs_rm3}
               for r in rows}
    return KindReport(
        fields={"kept_in": str(kept), "queries": queries, "systems": systems}, comparison=systems,
        heading=(f"EAR trial {spec.name}: {queries} test queries, {spec.expansion.n} {spec.expansion.source} "
                 f"expansions each; kept in {kept}"),
        rows=[(r.label, r.evaluation.aggregate) for r in rows],
        closing=[f"{ear.label} nDCG@10 against BM25 p={ear.p_vs_bm25:.3g}, against BM25+RM3 p={ear.p_vs_rm3:.3g} "
                 "(paired t-test)\n"])
