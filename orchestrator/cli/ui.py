"""``orchestrate ui``: the MLflow UI for the tracking store."""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

from orchestrator.cli.output import HelpFormatter, add_tracking, bounded
from workloads.core.errors import InputError
from workloads.core.logs import get_logger

log = get_logger("orchestrate")


def add_parser(sub, common) -> None:
    parser = sub.add_parser("ui", help="the MLflow UI for the tracking store (127.0.0.1 unless --host and --expose); "
                                       "with a sweep or trial file, on its experiment, with the links that compare its cells",
                            parents=[common], formatter_class=HelpFormatter)
    parser.add_argument("config", nargs="?", help="a sweep or trial YAML: open on its experiment")
    add_tracking(parser)
    parser.add_argument("--host", default="127.0.0.1", help="address to serve on")
    parser.add_argument("--port", type=bounded(int, 1, 65535, what="a TCP port"), default=5000, help="port to serve on")
    parser.add_argument("--expose", action="store_true", help="confirm binding to a non-loopback --host")
    parser.set_defaults(func=run)


def require_free_port(host: str, port: int) -> None:
    """One line before MLflow starts, instead of its URL and then uvicorn's 'address already in use'."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise InputError(f"--port {port}", f"cannot serve on {host}:{port} ({exc.strerror or exc}): choose another --port "
                                               "or stop what uses it") from None


def run(args: argparse.Namespace) -> int:
    from orchestrator.core.tracking import open_tracker

    if args.host != "127.0.0.1" and not args.expose:
        raise InputError("--host", f"binding to {args.host} exposes the MLflow UI beyond this machine: add --expose to confirm")
    tracker = open_tracker(args.tracking_uri, write=False)
    if tracker is None:
        raise InputError(args.tracking_uri or ".orchestrate/mlflow.db", "no MLflow store here: run something first "
                                                                      "(or give --tracking-uri)")
    links = experiment_links(tracker, experiment_of(args.config), f"http://{args.host}:{args.port}") if args.config else {}
    require_free_port(args.host, args.port)
    for experiment in tracker.client.search_experiments():  # stores written before experiments were marked
        if experiment.name != "Default":
            tracker.experiment_id(experiment.name)  # opens on the runs table, not on a GenAI traces overview
    env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
    log.info("MLflow UI for %s on %s", tracker.uri, links.get("experiment", f"http://{args.host}:{args.port}"))
    for label, url in links.items():
        if label != "experiment":
            log.info("  %s: %s", label, url)
    return subprocess.call([sys.executable, "-m", "mlflow", "server", "--backend-store-uri", tracker.uri,
                            "--host", args.host, "--port", str(args.port), "--workers", "1"], env=env)


def experiment_of(config: str) -> str:
    """The experiment a sweep file (its name) or a trial file (its experiment) writes to."""
    from orchestrator.cli.prepare import units_of

    name, _ = units_of(Path(config))
    return name


def experiment_links(tracker, name: str, base: str) -> dict[str, str]:
    """The UI's pages for experiment ``name``: its run list, the list filtered to cell runs, and
    the comparison of every cell (MLflow's compare page: parallel coordinates, scatter, contour)."""
    from orchestrator.core import schema  # noqa: PLC0415  (lazy: the run store's vocabulary loads the kinds, and torch)

    experiment = tracker.client.get_experiment_by_name(name)
    if experiment is None:
        raise InputError(name, f"no experiment '{name}' in {tracker.uri}: it has not run there (or give --tracking-uri)")
    eid = experiment.experiment_id
    view = "workflowType=machine_learning"  # MLflow 3's model-training view (else its GenAI one)
    links = {"experiment": f"{base}/#/experiments/{eid}?{view}"}
    cells = tracker.runs_of_kind(eid, schema.CELL)
    if cells:
        # MLflow 3.17's UI reads a filter only on the run list's own route (``/runs``: the
        # experiment's route redirects there and drops it) and, sorted by creation time, fetches
        # the matching runs' parents and shows the cells folded under the sweep run: the list
        # is sorted by the test measure instead (best first; a cell without one comes last)
        search = quote(f"tags.`{schema.KIND_TAG}` = '{schema.CELL}'")
        order = quote(f"metrics.`{schema.stored_metric_name(schema.target_prefix(schema.TEST) + 'ndcg_at_10')}`")
        links["cells"] = f"{base}/#/experiments/{eid}/runs?{view}&searchFilter={search}&orderByKey={order}&orderByAsc=false"
        # the tested cells (a failed or unfinished one has no test measure to plot, and the compare
        # page plots only the metrics every compared run has), in the query MLflow's own "Compare"
        # button builds: JSON lists of run and experiment ids
        tested = [run for run in cells if run.info.status == "FINISHED"]
        if tested:
            runs = json.dumps([run.info.run_id for run in tested], separators=(",", ":"))
            links["compare the tested cells"] = (f"{base}/#/compare-runs?runs={quote(runs)}&experiments="
                                                 f"{quote(json.dumps([eid]))}&{view}")
    return links
