"""Which Ray a command runs on: the cluster running on this machine, one named, or a private one.

Without ``--address`` or $RAY_ADDRESS a command joins the Ray cluster ``ray start`` (``ray up``,
KubeRay's head) runs on this machine, found as ``ray.init()`` finds it: the address the last
``ray start`` wrote to ``ray_current_cluster`` in Ray's temp directory ($RAY_TMPDIR/ray, else
/tmp/ray). Where none runs, it starts a private Ray for itself; ``--address local`` (or
RAY_ADDRESS=local) asks for that private Ray even where a cluster runs.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from workloads.core.errors import InputError

RAY_CONNECT_TIMEOUT_SECONDS = 5.0
LOCAL = "local"  # Ray's own word for "start a new Ray" (ray.init(address="local"))


def recorded_cluster() -> tuple[str | None, Path]:
    """The address the last ``ray start`` on this machine recorded, and the file it is in (Ray's
    own functions: the file ``ray.init()`` reads, under $RAY_TMPDIR when that is set)."""
    from ray._common.utils import get_ray_address_file
    from ray._private.utils import read_ray_address

    return read_ray_address(None), Path(get_ray_address_file(None))


def ray_address_to_join(address: str | None) -> str | None:
    """The Ray cluster to join (host:port, ray://host:port or auto), or None for a private Ray.

    A named address or a recorded one that does not answer within seconds is one line (Ray's
    client would retry its GCS connection for minutes). A recorded address nothing answers at
    is what a ``ray start`` cluster that died without ``ray stop`` leaves: it is neither joined
    nor replaced by a private Ray unasked (a sweep meant for the cluster would run on this
    machine alone). The file is Ray's and is left alone: ``ray stop`` removes it (and ends
    whatever of that cluster still runs here), ``--address local`` runs beside it."""
    named = address or os.environ.get("RAY_ADDRESS")
    if named == LOCAL:
        return None
    if named == "auto":  # Ray's own search, which fails where it finds no cluster
        return named
    if named:
        source = named if address else f"RAY_ADDRESS={named}"
        why = _no_answer(named, source)
        if why:
            raise InputError(source, f"no Ray cluster answers there within {RAY_CONNECT_TIMEOUT_SECONDS:.0f} s ({why}): "
                                     "start it (ray start --head, ray up) or fix --address")
        return named
    recorded, address_file = recorded_cluster()
    if not recorded:
        return None
    why = _no_answer(recorded, str(address_file))
    if why:
        raise InputError(str(address_file), f"it records the Ray cluster at {recorded}, where nothing answers within "
                                            f"{RAY_CONNECT_TIMEOUT_SECONDS:.0f} s ({why}): a cluster that stopped "
                                            f"without `ray stop`; run `ray stop` (it removes the file) or pass "
                                            f"--address {LOCAL} for a private Ray")
    return recorded


def _no_answer(address: str, source: str) -> str | None:
    """Why nothing answers at ``address`` (a TCP connection to its GCS port), or None when something does."""
    host, _, port = address.removeprefix("ray://").rstrip("/").rpartition(":")
    if not host or not port.isdigit():
        raise InputError(source, "not a Ray address (host:port, ray://host:port, auto or local)")
    try:
        with socket.create_connection((host, int(port)), timeout=RAY_CONNECT_TIMEOUT_SECONDS):
            return None
    except OSError as exc:
        return str(exc.strerror or exc)


def check_ray_address(address: str | None) -> str | None:
    """Before a command writes anything: the cluster it will join (None: a private Ray), or one
    line where the address it would join does not answer."""
    return ray_address_to_join(address)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def describe_joined(address: str) -> str:
    """One line on the cluster just joined: its address, live nodes, CPUs and GPUs in total."""
    import ray

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    total = ray.cluster_resources()
    address = ray.get_runtime_context().gcs_address if address == "auto" else address
    return (f"joined the Ray cluster at {address}: {len(nodes)} node{'s' if len(nodes) != 1 else ''}, "
            f"{total.get('CPU', 0):g} CPUs, {total.get('GPU', 0):g} GPUs")
