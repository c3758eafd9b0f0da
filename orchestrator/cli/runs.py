"""``orchestrate runs``: the MLflow runs of a sweep or trial file, with the ids ``compare`` takes."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from orchestrator.cli.output import HelpFormatter, add_tracking, emit
from workloads.core.errors import InputError


class _RunKinds:
    """The KIND_TAG values (``schema.run_kinds``: sweep, cell, then every registered trial kind's),
    read when ``--kind`` is checked or shown: parsing the command line imports no trial kind."""

    def _kinds(self) -> tuple[str, ...]:
        from orchestrator.core.schema import run_kinds

        return run_kinds()

    def __contains__(self, value: object) -> bool:
        return value in self._kinds()

    def __iter__(self):
        return iter(self._kinds())

    def index(self, value: str) -> int:
        return self._kinds().index(value)


KINDS = _RunKinds()


def add_parser(sub, common) -> None:
    parser = sub.add_parser("runs", help="list a sweep's or trial file's MLflow runs with their ids (for compare, the UI)",
                            parents=[common], formatter_class=HelpFormatter)
    parser.add_argument("config", help="a sweep YAML or a trial YAML")
    parser.add_argument("--kind", choices=KINDS, help="only runs of this kind (default: every kind)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    add_tracking(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from orchestrator.core import schema
    from orchestrator.core.config import read_yaml
    from orchestrator.core.tracking import open_tracker

    data, _ = read_yaml(Path(args.config))
    sweep = None
    if "grid" in data:
        from orchestrator.sweep.grid import load_sweep

        sweep = load_sweep(args.config)
        experiment = sweep.name
    else:
        from orchestrator.cli.run import selected_trials

        experiment, _ = selected_trials(args)
    tracker = open_tracker(args.tracking_uri, write=False)
    found = tracker.client.get_experiment_by_name(experiment) if tracker is not None else None
    if sweep is not None and found is not None:
        from orchestrator.sweep.store import experiment_owner

        experiment_owner(sweep, tracker, found)
    if found is None:
        raise InputError(args.config, f"no MLflow experiment '{experiment}' in {tracker.uri if tracker else 'this store'}: "
                                      "nothing has run yet (or give --tracking-uri)")
    runs = tracker.client.search_runs([found.experiment_id], max_results=50_000)
    rows = []
    for r in runs:
        kind = r.data.tags.get(schema.KIND_TAG, "trial")
        if args.kind and kind != args.kind:
            continue
        axes = "/".join(r.data.tags[a] for a in schema.GRID_AXES if a in r.data.tags)
        status = r.info.status
        if r.data.tags.get(schema.INTERRUPTED_TAG) == "true":
            status = "INTERRUPTED"
        elif schema.PRUNED_TAG in r.data.tags:
            status = "PRUNED"
        rows.append({"run_id": r.info.run_id, "kind": kind, "name": r.info.run_name, "status": status, "axes": axes,
                     "val_ndcg_at_10": r.data.metrics.get(schema.BEST_OBJECTIVE),
                     "test_ndcg_at_10": r.data.metrics.get(f"{schema.target_prefix(schema.TEST)}ndcg_at_10")})
    rows.sort(key=lambda r: (KINDS.index(r["kind"]) if r["kind"] in KINDS else 9, r["axes"], r["name"] or ""))
    if args.json:
        emit(json.dumps({"experiment": experiment, "tracking_uri": tracker.uri, "runs": rows}, indent=2))
        return 0
    emit(f"experiment {experiment} ({tracker.uri}): {len(rows)} runs")
    name_width = max([10, *(len(r["name"] or "") + 2 for r in rows)])
    emit(f"{'run id':<34}{'kind':<10}{'status':<13}{'name':<{name_width}}{'val':>8}{'test':>8}  axes")
    for r in rows:
        val = f"{r['val_ndcg_at_10']:.4f}" if r["val_ndcg_at_10"] is not None else "-"
        test = f"{r['test_ndcg_at_10']:.4f}" if r["test_ndcg_at_10"] is not None else "-"
        emit(f"{r['run_id']:<34}{r['kind']:<10}{r['status']:<13}{r['name'] or '':<{name_width}}{val:>8}{test:>8}  {r['axes']}")
    return 0
