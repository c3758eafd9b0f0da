"""The cluster's Python and the driver's. Ray refuses a driver whose Python minor version is not
the cluster's, in a message of many lines once a sweep has started; these checks say it in one
line before anything is written (``orchestrate sweep`` and its ``--dry-run``)."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

from orchestrator.core.ray_address import RAY_CONNECT_TIMEOUT_SECONDS
from workloads.core.errors import InputError

# The cluster's Python (major.minor), one setting: what cluster/node-setup.sh installs on every node
# and k8s/Dockerfile's image runs. The project is installed in place (-e), so the file is beside it.
CLUSTER_PYTHON_FILE = Path(__file__).resolve().parents[2] / "cluster" / "python-version"


def driver_python() -> str:
    return f"{sys.version_info[0]}.{sys.version_info[1]}"


def live_cluster_python(address: str) -> str | None:
    """The Python (major.minor) the cluster at ``address`` was started with, as its GCS reports it
    (the metadata Ray's own version check reads); None where it cannot be asked: a Ray Client
    address (ray://), no answer within seconds, a GCS that says nothing."""
    if address.startswith("ray://"):
        return None
    try:
        import ray
        import ray._common.usage.usage_lib as usage  # Ray serves no public API for the cluster's versions
        from ray._raylet import GcsClient

        if address == "auto":
            address = ray._private.services.canonicalize_bootstrap_address("auto")
        host, _, port = address.rpartition(":")
        with socket.create_connection((host, int(port)), timeout=RAY_CONNECT_TIMEOUT_SECONDS):
            pass
        version = (usage.get_cluster_metadata(GcsClient(address=address)) or {}).get("python_version", "")
    except Exception:  # no answer, or internal APIs that moved: Ray's own check at connection still holds
        return None
    return ".".join(version.split(".")[:2]) or None


def check_driver_python(address: str | None, dry_run: bool = False) -> None:
    """A driver aimed at a cluster (``--address`` or $RAY_ADDRESS) runs the cluster's Python minor
    version: Ray refuses a driver of another one when it connects, in a long message, after the
    sweep has started. One line instead, before anything is written. The cluster's version is the
    live cluster's where it answers; the dry run of a cluster that does not (yet) answer reads
    the setting it will be set up with (cluster/python-version)."""
    address = address or os.environ.get("RAY_ADDRESS")
    if not address or address == "local":
        return
    cluster, source = live_cluster_python(address), address
    if cluster is None and dry_run and CLUSTER_PYTHON_FILE.is_file():
        cluster, source = CLUSTER_PYTHON_FILE.read_text().strip(), "cluster/python-version"
    if cluster is not None and cluster != driver_python():
        raise InputError(source, f"the cluster runs Python {cluster} but this driver runs Python {driver_python()} "
                                 f"({sys.executable}): Ray refuses a driver of another minor version; run orchestrate "
                                 f"from a Python {cluster} venv")
