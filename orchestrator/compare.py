"""``orchestrate compare RUN_A RUN_B``: two runs (a cell's winner or a tested trial) side by side.

Per measure: both means, the difference (B - A), the paired test's p-value on the shared
queries; then the queries whose primary measure changed most. The numbers come from the
runs' per-query values, cross-checked against their logged aggregates.
"""

from __future__ import annotations

from pathlib import Path

from orchestrator.results import RunReader
from orchestrator.tracking import KIND_TAG, Tracker
from workloads.errors import InputError
from workloads.evaluation import DISPLAY_NAMES, MEASURES, PRIMARY_METRIC
from workloads.significance import TEST_NAMES, paired_test, paired_values


def _get_run(tracker: Tracker, run_id: str):
    from mlflow.exceptions import MlflowException

    try:
        return tracker.client.get_run(run_id)
    except MlflowException:
        raise InputError(run_id, f"no such MLflow run in {tracker.uri}") from None


def _describe(run) -> str:
    tags = run.data.tags
    axes = "/".join(tags[a] for a in ("model", "loss", "augmentation", "size") if a in tags)
    return f"{run.info.run_name} [{tags.get(KIND_TAG, 'run')}{': ' + axes if axes else ''}]"


def _prefix(tracker: Tracker, run, collection: str | None) -> str:
    """The per-query artifact of ``collection`` (``test`` by default, or a zero-shot name)."""
    available = sorted(Path(a.path).stem for a in tracker.client.list_artifacts(run.info.run_id, "per_query"))
    wanted = "test" if collection in (None, "test") else collection
    for name in (wanted, f"zs_{wanted}_test"):
        if name in available:
            return f"{name}_"
    tested = [a for a in available if not a.startswith("bm25")]
    hint = f"it has: {', '.join(tested)}" if tested else ("a sweep's trial runs are not tested: compare their cells (the winners)"
                                                          if run.data.tags.get(KIND_TAG) == "trial" else "it was never tested")
    raise InputError(run.info.run_id, f"no per-query values for '{wanted}' ({hint})")


def compare_runs(tracker: Tracker, run_a: str, run_b: str, collection: str | None = None, test: str = "t",
                 top: int = 10) -> dict:
    a, b = _get_run(tracker, run_a), _get_run(tracker, run_b)
    reader = RunReader(tracker)
    prefix_a, prefix_b = _prefix(tracker, a, collection), _prefix(tracker, b, collection)
    values_a, values_b = reader.per_query(a, prefix_a), reader.per_query(b, prefix_b)
    measures = {}  # metric -> paired_test(B, A): its "a" side is run B, so difference is B - A
    for metric in (m for m in MEASURES if m in values_a.values and m in values_b.values):
        try:
            measures[metric] = paired_test(values_b.values[metric], values_a.values[metric], test)
        except ValueError as exc:
            raise InputError(f"{run_a} vs {run_b}", str(exc)) from None
    if not measures:
        raise InputError(f"{run_a} vs {run_b}", "the two runs share no measure")
    primary = PRIMARY_METRIC if PRIMARY_METRIC in measures else next(iter(measures))
    qids, xs, ys = paired_values(values_a.values[primary], values_b.values[primary])
    changes = sorted(zip(qids, xs.tolist(), ys.tolist()), key=lambda r: (-abs(r[2] - r[1]), r[0]))[:top]
    return {
        "a": {"run_id": a.info.run_id, "name": _describe(a), "collection": prefix_a.rstrip("_")},
        "b": {"run_id": b.info.run_id, "name": _describe(b), "collection": prefix_b.rstrip("_")},
        "test": TEST_NAMES[test], "queries": len(qids),
        "measures": [{"metric": metric, "a": m.mean_b, "b": m.mean_a, "difference": m.difference, "p_value": m.p_value}
                     for metric, m in measures.items()],
        "primary": primary,
        "most_changed": [{"query_id": q, "a": x, "b": y, "difference": y - x} for q, x, y in changes],
    }


def format_comparison(result: dict) -> str:
    lines = [f"A: {result['a']['run_id']} {result['a']['name']} ({result['a']['collection']})",
             f"B: {result['b']['run_id']} {result['b']['name']} ({result['b']['collection']})",
             f"{result['queries']} queries; p: {result['test']}", "",
             f"{'measure':<10}{'A':>9}{'B':>9}{'B - A':>9}{'p':>9}"]
    for m in result["measures"]:
        mark = " †" if m["p_value"] < 0.05 else " °" if m["p_value"] < 0.10 else ""
        lines.append(f"{DISPLAY_NAMES.get(m['metric'], m['metric']):<10}{m['a']:>9.4f}{m['b']:>9.4f}"
                     f"{m['difference']:>+9.4f}{m['p_value']:>9.4f}{mark}")
    lines += ["", f"queries whose {DISPLAY_NAMES.get(result['primary'], result['primary'])} changed most:",
              f"{'query':<14}{'A':>9}{'B':>9}{'B - A':>9}"]
    lines += [f"{q['query_id']:<14}{q['a']:>9.4f}{q['b']:>9.4f}{q['difference']:>+9.4f}" for q in result["most_changed"]]
    return "\n".join(lines)
