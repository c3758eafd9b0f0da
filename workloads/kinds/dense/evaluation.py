"""First-stage retrieval measured against BM25: nDCG@10, R@100, R@1000, each with a paired test.

Every system is evaluated on the same judged queries (a query a run misses counts 0, as in
:func:`workloads.evaluation.evaluate`), and compared with the baseline per query with
:func:`workloads.evaluation.significance.paired_test` (the project's t-test, Wilcoxon or
randomization test).
"""

from __future__ import annotations

from dataclasses import dataclass

from workloads.data.collections import Qrels
from workloads.evaluation import DISPLAY_NAMES, evaluate
from workloads.evaluation.significance import paired_test

Run = dict[str, dict[str, float]]
FIRST_STAGE_MEASURES = ("ndcg_at_10", "recall_at_100", "recall_at_1000")


@dataclass(frozen=True)
class SystemRow:
    name: str
    values: dict[str, float]          # measure -> mean over the judged queries
    p_values: dict[str, float | None]  # measure -> p against the baseline (None for the baseline itself)


def compare_first_stages(runs: dict[str, Run], qrels: Qrels, relevance_level: int = 1, baseline: str = "bm25",
                         test: str = "t", measures: tuple[str, ...] = FIRST_STAGE_MEASURES) -> list[SystemRow]:
    """One row per run (in the given order), each measure's mean and its paired p-value against ``baseline``."""
    if baseline not in runs:
        raise ValueError(f"no baseline run '{baseline}' among {', '.join(runs)}")
    evaluations = {name: evaluate(run, qrels, relevance_level, measures) for name, run in runs.items()}
    base = evaluations[baseline]
    rows = []
    for name, evaluation in evaluations.items():
        p_values = {m: None if name == baseline else paired_test(evaluation.per_query[m], base.per_query[m], test).p_value
                    for m in measures}
        rows.append(SystemRow(name, dict(evaluation.aggregate), p_values))
    return rows


def markdown_table(rows: list[SystemRow], measures: tuple[str, ...] = FIRST_STAGE_MEASURES, level: float = 0.05) -> str:
    """The rows as a Markdown table; a dagger marks p < ``level`` against the baseline."""
    head = "| system | " + " | ".join(DISPLAY_NAMES.get(m, m) for m in measures) + " |"
    lines = [head, "|:---|" + "---:|" * len(measures)]
    for row in rows:
        cells = [f"{row.values[m]:.4f}" + ("†" if row.p_values[m] is not None and row.p_values[m] < level else "")
                 for m in measures]
        lines.append(f"| {row.name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


__all__ = ["FIRST_STAGE_MEASURES", "SystemRow", "compare_first_stages", "markdown_table"]
