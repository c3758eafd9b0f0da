"""Drain this Ray node, as preempted, when AWS announces its spot interruption.

A daemon on every GPU worker (``cluster.yaml`` starts it after ``ray start``) polls the instance
metadata for the two-minute notice (:class:`workloads.training.spot.SpotNotice`'s request, its
``ORCHESTRATE_INSTANCE_METADATA`` fake endpoint in tests) and, on the notice, asks Ray's GCS to
drain its own node with the reason ``DRAIN_NODE_REASON_PREEMPTION`` and the notice's time as
the deadline: what ``ray drain-node`` does, and what Ray's own autoscaler v2 does on a
preemption. Ray Train V2 then sees the drain, waits until the deadline and restarts the worker
group on another node, charging the restart to ``FailureConfig.max_preemption_failures``
(unlimited by default), not to ``max_failures``; when the node then goes, its actors' deaths
carry the preemption reason, which Train also counts as a preemption. No new work is placed on
a draining node.

A daemon, not a hook in the training loop: the training worker is the data plane, which never
imports Ray, and a node is drained once whatever runs on it (several trials, or none yet).

    python -m orchestrator.core.spot_drain [--address HEAD:6379] [--node-id HEX] [--every SECONDS]
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from datetime import datetime

from workloads.training.spot import METADATA_ENV, METADATA_URL, POLL_ENV, POLL_SECONDS, SpotNotice

log = logging.getLogger("spot-drain")

NOTICE_SECONDS = 120  # AWS's notice: the instance goes two minutes after it (when the notice has no time)
UNREACHABLE_TRIES = 3  # after this many failed requests in a row, say once that no metadata answers


def deadline_ms(notice: dict, now: float | None = None) -> int:
    """When the node goes, in epoch milliseconds, as Ray's drain takes it: the notice's ``time``
    (``2026-11-27T05:30:00Z``), else two minutes from now; never before a second from now."""
    now = time.time() if now is None else now
    try:
        when = datetime.fromisoformat(str(notice["time"])).timestamp()
    except (KeyError, ValueError):
        when = now + NOTICE_SECONDS
    return int(max(when, now + 1) * 1000)


def watch(check: Callable[[], dict | None], drain: Callable[[dict], bool], every: float,
          stop: threading.Event) -> dict | None:
    """Poll ``check`` every ``every`` seconds until a notice comes and ``drain`` accepts it (a
    refused or failed drain is tried again at the next poll); the notice, or None once stopped."""
    unreachable = 0
    while not stop.is_set():
        try:
            notice = check()
            unreachable = 0
        except OSError as exc:  # the metadata service or the network: ask again next time
            unreachable += 1
            if unreachable == UNREACHABLE_TRIES:
                log.warning("no instance metadata answers (%s): still asking every %g s", exc, every)
            notice = None
        if notice is not None:
            try:
                if drain(notice):
                    return notice
            except Exception:  # the GCS out of reach for a moment: the notice is still there next poll
                log.exception("draining this node failed; trying again")
        stop.wait(every)
    return None


def node_on_this_machine(gcs_client) -> str:
    """The hex id of the one live Ray node whose address is this machine's."""
    import ray
    from ray._private.services import get_node_ip_address
    from ray.core.generated.gcs_pb2 import GcsNodeInfo

    ip = get_node_ip_address()
    nodes = gcs_client.get_all_node_info(timeout=10, state_filter=GcsNodeInfo.GcsNodeState.ALIVE).values()
    here = [ray.NodeID(info.node_id).hex() for info in nodes if info.node_manager_address == ip]
    if len(here) != 1:
        raise RuntimeError(f"{len(here)} live Ray nodes at {ip}: name the node with --node-id")
    return here[0]


def ray_drain(address: str, node_id: str | None = None) -> Callable[[dict], bool]:
    """A drain through the GCS at ``address`` (``ray drain-node``'s call): True when accepted."""
    from ray._raylet import GcsClient
    from ray.core.generated import autoscaler_pb2

    gcs_client = GcsClient(address=address)

    def drain(notice: dict) -> bool:
        node = node_id or node_on_this_machine(gcs_client)  # looked up now: a restarted Ray has a new id
        message = f"spot interruption notice: {notice.get('action', '?')} at {notice.get('time', '?')}"
        accepted, why = gcs_client.drain_node(node, autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION"),
                                              message, deadline_ms(notice))
        if accepted:
            log.warning("draining Ray node %s as preempted (%s)", node, message)
        else:
            log.error("Ray refused to drain node %s: %s", node, why)
        return bool(accepted)

    return drain


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", default=None, help="the head's GCS (default: RAY_ADDRESS or this node's cluster)")
    parser.add_argument("--node-id", default=None, help="the node to drain (default: the one on this machine)")
    parser.add_argument("--every", type=float, default=float(os.environ.get(POLL_ENV, POLL_SECONDS)), help="seconds")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    from ray._private.services import canonicalize_bootstrap_address_or_die

    endpoint = os.environ.get(METADATA_ENV) or METADATA_URL
    if endpoint.strip().lower() in ("off", "none", "0", "false"):
        log.info("%s=%s: not watching for spot notices", METADATA_ENV, endpoint)
        threading.Event().wait()  # (an exit would only be restarted by the supervisor)
    drain = ray_drain(canonicalize_bootstrap_address_or_die(args.address), args.node_id)
    notice = watch(SpotNotice(endpoint).check, drain, args.every, threading.Event())
    log.info("drained on %s; waiting for the instance to go", notice)
    threading.Event().wait()  # a supervisor would restart an exit, and drain again: stay until the node goes
    return 0


if __name__ == "__main__":
    sys.exit(main())
