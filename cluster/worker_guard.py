"""Stop the autoscaler from relaunching GPU workers whose setup keeps failing.

Ray's autoscaler terminates a worker whose setup fails and, while trials still wait for a GPU,
launches another: with a cause that does not go away (a driver, a quota, a broken install) it
does so forever, each try billed. Every failing worker appends a line to a log on the shared
volume (``cluster/node-setup.sh``); this guard, run on the head as a service
(``cluster/service.sh start worker-guard -- ...``), watches that log and, once ``--max`` failures
fall within ``--window`` seconds, sets ``max_workers: 0`` for every worker type in the
autoscaler's own config file (``~/ray_bootstrap_config.yaml``, which the autoscaler reads again
on every update), keeping the original beside it. ``ray up cluster.yaml`` writes the file anew:
fix the cause, remove the log, run it again.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import time
from pathlib import Path

import yaml

log = logging.getLogger("worker-guard")


def recent_failures(failures: Path, window_s: float, now: float | None = None) -> list[str]:
    """The log's lines (``<epoch> <when> <host> step ...``) within the last ``window_s`` seconds."""
    now = time.time() if now is None else now
    try:
        lines = failures.read_text().splitlines()
    except FileNotFoundError:
        return []
    recent = []
    for line in lines:
        stamp = line.split(" ", 1)[0]
        if stamp.isdigit() and now - int(stamp) < window_s:
            recent.append(line)
    return recent


def stop_launching(config_file: Path, reason: str) -> bool:
    """Set every worker type's ``max_workers`` to 0 in the autoscaler's config (the original kept
    as ``<file>.before-guard``); False when no worker type could be launched anyway."""
    config = yaml.safe_load(config_file.read_text())
    head = config.get("head_node_type")
    workers = {name: spec for name, spec in config.get("available_node_types", {}).items() if name != head}
    if not any(spec.get("max_workers", 0) for spec in workers.values()):
        return False
    shutil.copyfile(config_file, config_file.with_name(config_file.name + ".before-guard"))
    for spec in workers.values():
        spec["max_workers"] = 0
        spec["min_workers"] = 0
    tmp = config_file.with_name(config_file.name + ".tmp")
    tmp.write_text(yaml.safe_dump(config, sort_keys=False))
    os.replace(tmp, config_file)  # the autoscaler never reads half a file
    log.error("stopped launching workers (%s): every worker type's max_workers is now 0 in %s", reason, config_file)
    return True


def check_once(failures: Path, config_file: Path, max_failures: int, window_s: float, now: float | None = None) -> bool:
    recent = recent_failures(failures, window_s, now)
    if len(recent) < max_failures:
        return False
    reason = f"{len(recent)} worker setups failed within {window_s / 3600:g} h, the last: {recent[-1]}"
    return stop_launching(config_file, reason)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--failures", type=Path, default=Path("/mnt/shared/cluster/worker-setup-failures.log"))
    parser.add_argument("--config", type=Path, default=Path.home() / "ray_bootstrap_config.yaml")
    parser.add_argument("--max", type=int, default=int(os.environ.get("RERANK_LAB_MAX_SETUP_FAILURES", "3")))
    parser.add_argument("--window", type=float, default=7200.0, help="seconds")
    parser.add_argument("--every", type=float, default=30.0, help="seconds between checks")
    parser.add_argument("--once", action="store_true", help="check once and exit")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    while True:
        check_once(args.failures, args.config, args.max, args.window)
        if args.once:
            return 0
        time.sleep(args.every)


if __name__ == "__main__":
    sys.exit(main())
