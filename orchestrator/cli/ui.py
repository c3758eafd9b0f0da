"""``orchestrate ui``: the MLflow UI for the tracking store."""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys

from orchestrator.cli.output import HelpFormatter, add_tracking, bounded
from workloads.errors import InputError
from workloads.logs import get_logger

log = get_logger("orchestrate")


def add_parser(sub, common) -> None:
    parser = sub.add_parser("ui", help="the MLflow UI for the tracking store (127.0.0.1 unless --host and --expose)",
                            parents=[common], formatter_class=HelpFormatter)
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
    require_free_port(args.host, args.port)
    for experiment in tracker.client.search_experiments():  # stores written before experiments were marked
        if experiment.name != "Default":
            tracker.experiment_id(experiment.name)  # opens on the runs table, not on a GenAI traces overview
    env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
    log.info("MLflow UI for %s on http://%s:%s", tracker.uri, args.host, args.port)
    return subprocess.call([sys.executable, "-m", "mlflow", "server", "--backend-store-uri", tracker.uri,
                            "--host", args.host, "--port", str(args.port), "--workers", "1"], env=env)
