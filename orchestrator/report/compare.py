"""``orchestrate compare RUN_A [RUN_B]``: two rankings side by side.

A ranking is a run (a cell's winner, or a trial tested by ``orchestrate run``) or, written
``RUN:bm25``, that run's first stage on the same queries; without RUN_B, RUN_A is compared
with its own BM25. Per measure: both means, the difference (B - A) with its paired t
95% interval over the shared queries, the queries B won / tied / lost, the effect size (mean
difference / its standard deviation) and the paired test's p-value; then the queries whose
primary measure changed most. The numbers come from the runs' per-query values,
cross-checked against their logged aggregates.
"""

from __future__ import annotations

from pathlib import Path

from orchestrator.core import schema
from orchestrator.core.tracking import Tracker
from orchestrator.report.results import RunReader
from workloads.core.errors import InputError
from workloads.evaluation import DISPLAY_NAMES, MEASURES, PRIMARY_METRIC
from workloads.evaluation.significance import TEST_NAMES, paired_test, paired_values
from workloads.evaluation.statistics import compare_uncertainty

FIRST_STAGE_SUFFIX = f":{schema.FIRST_STAGE}"


def _get_run(tracker: Tracker, reference: str):
    """``RUN`` or ``RUN:bm25`` -> (the MLflow run, whether the first stage is meant)."""
    from mlflow.exceptions import MlflowException

    run_id = reference.removesuffix(FIRST_STAGE_SUFFIX)
    try:
        return tracker.client.get_run(run_id), reference.endswith(FIRST_STAGE_SUFFIX)
    except MlflowException:
        raise InputError(run_id, f"no such MLflow run in {tracker.uri}") from None


def _describe(run, first_stage: bool) -> str:
    tags = run.data.tags
    axes = "/".join(tags[a] for a in ("model", "loss", "augmentation", "size") if a in tags)
    described = f"{run.info.run_name} [{tags.get(schema.KIND_TAG, 'run')}{': ' + axes if axes else ''}]"
    return f"BM25 of {described}" if first_stage else described


def _prefix(tracker: Tracker, run, collection: str | None, first_stage: bool) -> str:
    """The per-query artifact of ``collection`` (``test`` by default, or a zero-shot name),
    the first stage's with ``first_stage``."""
    available = sorted(Path(a.path).stem for a in tracker.run_artifacts(run).list_artifacts("per_query"))
    wanted = schema.TEST if collection in (None, schema.TEST) else collection
    for target in (wanted, schema.zero_shot_target(wanted, "test")):
        prefix = schema.first_stage_prefix(target) if first_stage else schema.target_prefix(target)
        if prefix.rstrip("_") in available:
            return prefix
    tested = [a for a in available if not a.startswith(schema.FIRST_STAGE)]
    hint = f"it has: {', '.join(tested)}" if tested else ("a sweep's trial runs are not tested: compare their cells (the winners)"
                                                          if run.data.tags.get(schema.KIND_TAG) == schema.TRIAL else "it was never tested")
    if first_stage and tested:
        hint = "it was tested before the first stage's per-query values were stored with each evaluation"
    raise InputError(run.info.run_id, f"no per-query values for '{wanted}'{' (BM25)' if first_stage else ''} ({hint})")


def compare_runs(tracker: Tracker, run_a: str, run_b: str, collection: str | None = None, test: str = "t",
                 top: int = 10) -> dict:
    (a, a_first), (b, b_first) = _get_run(tracker, run_a), _get_run(tracker, run_b)
    reader = RunReader(tracker)
    prefix_a, prefix_b = _prefix(tracker, a, collection, a_first), _prefix(tracker, b, collection, b_first)
    values_a, values_b = reader.per_query(a, prefix_a), reader.per_query(b, prefix_b)
    measures = {}  # metric -> paired_test(B, A): its "a" side is run B, so difference is B - A
    uncertainty = {}  # metric -> B - A's interval, direction and effect
    for metric in (m for m in MEASURES if m in values_a.values and m in values_b.values):
        try:
            measures[metric] = paired_test(values_b.values[metric], values_a.values[metric], test)
        except ValueError as exc:
            raise InputError(f"{run_a} vs {run_b}", str(exc)) from None
        uncertainty[metric] = compare_uncertainty({"": values_b.values[metric]}, {"": values_a.values[metric]})
    if not measures:
        raise InputError(f"{run_a} vs {run_b}", "the two runs share no measure")
    primary = PRIMARY_METRIC if PRIMARY_METRIC in measures else next(iter(measures))
    qids, xs, ys = paired_values(values_a.values[primary], values_b.values[primary])
    changes = sorted(zip(qids, xs.tolist(), ys.tolist()), key=lambda r: (-abs(r[2] - r[1]), r[0]))[:top]
    return {
        "a": {"run_id": a.info.run_id, "name": _describe(a, a_first), "collection": prefix_a.rstrip("_")},
        "b": {"run_id": b.info.run_id, "name": _describe(b, b_first), "collection": prefix_b.rstrip("_")},
        "test": TEST_NAMES[test], "queries": len(qids),
        "interval": "95% paired t interval of B - A over the queries",
        "measures": [{"metric": metric, "a": m.mean_b, "b": m.mean_a, "difference": m.difference,
                      "ci_low": uncertainty[metric].interval.low, "ci_high": uncertainty[metric].interval.high,
                      "won": uncertainty[metric].direction.won, "tied": uncertainty[metric].direction.tied,
                      "lost": uncertainty[metric].direction.lost, "effect_size": uncertainty[metric].effect,
                      "p_value": m.p_value}
                     for metric, m in measures.items()],
        "primary": primary,
        "most_changed": [{"query_id": q, "a": x, "b": y, "difference": y - x} for q, x, y in changes],
    }


def format_comparison(result: dict) -> str:
    lines = [f"A: {result['a']['run_id']} {result['a']['name']} ({result['a']['collection']})",
             f"B: {result['b']['run_id']} {result['b']['name']} ({result['b']['collection']})",
             f"{result['queries']} queries; p: {result['test']}; interval: {result['interval']}; won / tied / lost: "
             "queries where B is better / equal / worse; effect: mean difference / its standard deviation", "",
             f"{'measure':<10}{'A':>9}{'B':>9}{'B - A':>9}{'95% interval':>21}{'won/tied/lost':>16}{'effect':>8}{'p':>9}"]
    for m in result["measures"]:
        mark = " †" if m["p_value"] < 0.05 else " °" if m["p_value"] < 0.10 else ""
        effect = "-" if m["effect_size"] is None else f"{m['effect_size']:+.2f}"
        lines.append(f"{DISPLAY_NAMES.get(m['metric'], m['metric']):<10}{m['a']:>9.4f}{m['b']:>9.4f}"
                     f"{m['difference']:>+9.4f}{'[' + format(m['ci_low'], '+.4f') + ', ' + format(m['ci_high'], '+.4f') + ']':>21}"
                     f"{str(m['won']) + '/' + str(m['tied']) + '/' + str(m['lost']):>16}{effect:>8}{m['p_value']:>9.4f}{mark}")
    lines += ["", f"queries whose {DISPLAY_NAMES.get(result['primary'], result['primary'])} changed most:",
              f"{'query':<14}{'A':>9}{'B':>9}{'B - A':>9}"]
    lines += [f"{q['query_id']:<14}{q['a']:>9.4f}{q['b']:>9.4f}{q['difference']:>+9.4f}" for q in result["most_changed"]]
    return "\n".join(lines)
