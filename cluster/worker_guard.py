"""Stop the autoscaler from relaunching GPU workers whose setup keeps failing.

Ray's autoscaler terminates a worker whose setup fails and, while trials still wait for a GPU,
launches another: with a cause that does not go away (a driver, a quota, a broken install) it
does so forever, each try billed. Every failing worker prints a record of its failure on stderr
(``cluster/node-setup.sh``), which the autoscaler, running the script over ssh from the head,
writes into its own log on the head (``monitor.err`` of the current Ray session): this guard, run
on the head as a service (``cluster/service.sh start worker-guard -- ...``), copies each new
record into the failure log on the shared volume (where a worker whose volume mounted also
writes it; the same line is kept once), so a mount that fails is counted too, and, once ``--max`` failures
fall within ``--window`` seconds, sets ``max_workers: 0`` for every worker type in the
autoscaler's own config file (``~/ray_bootstrap_config.yaml``, which the autoscaler reads again
on every update), keeping the original beside it. ``ray up cluster.yaml`` writes the file anew:
fix the cause, remove the log, run it again.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
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
    for line in dict.fromkeys(lines):  # a line written twice (by its worker and by the guard) is one failure
        stamp = line.split(" ", 1)[0]
        if stamp.isdigit() and now - int(stamp) < window_s:
            recent.append(line)
    return recent


# what node-setup.sh prints after this marker is the failure log's line itself
RECORD = re.compile(r"rerank-lab setup failure record: (\d+ \S+ \S+ step '.*' exit \d+)")


class AutoscalerLog:
    """New failure records in the autoscaler's log files (``monitor.out``, ``monitor.err``, their
    rotated copies) in ``logs_dir``; each file read from where the previous call stopped. Only the
    current session's logs: ``ray up`` starts a new session, so records from before the fix that
    followed a refusal are not read again."""

    def __init__(self, logs_dir: Path) -> None:
        self.logs_dir = logs_dir
        self.read_up_to: dict[Path, int] = {}

    def new_records(self) -> list[str]:
        records = []
        for path in sorted(self.logs_dir.glob("monitor*")):
            path = path.resolve()
            try:
                with open(path, "rb") as file:
                    start = self.read_up_to.get(path, 0)
                    if file.seek(0, os.SEEK_END) < start:  # rotated under the same name: read it anew
                        start = 0
                    file.seek(start)
                    data = file.read()
            except OSError:  # gone between the listing and the read (rotation)
                continue
            complete = data.rfind(b"\n") + 1  # a line being written is read next time, whole
            self.read_up_to[path] = start + complete
            for line in data[:complete].decode(errors="replace").splitlines():
                found = RECORD.search(line.replace("\r", ""))  # (ssh with a tty ends lines with \r\n)
                if found:
                    records.append(found.group(1))
        return records


def record_failures(failures: Path, records: list[str]) -> int:
    """Append the records not yet in the failure log; how many were new."""
    try:
        known = set(failures.read_text().splitlines())
    except FileNotFoundError:
        known = set()
    new = [r for r in dict.fromkeys(records) if r not in known]
    if new:
        failures.parent.mkdir(parents=True, exist_ok=True)
        with open(failures, "a") as file:
            file.write("".join(f"{r}\n" for r in new))
        log.warning("recorded %d worker setup failure(s) from the autoscaler's log: %s", len(new), new[-1])
    return len(new)


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


def check_once(failures: Path, config_file: Path, max_failures: int, window_s: float, now: float | None = None,
               autoscaler_log: AutoscalerLog | None = None) -> bool:
    if autoscaler_log is not None:
        record_failures(failures, autoscaler_log.new_records())
    recent = recent_failures(failures, window_s, now)
    if len(recent) < max_failures:
        return False
    reason = f"{len(recent)} worker setups failed within {window_s / 3600:g} h, the last: {recent[-1]}"
    return stop_launching(config_file, reason)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--failures", type=Path, default=Path("/mnt/shared/cluster/worker-setup-failures.log"))
    parser.add_argument("--config", type=Path, default=Path.home() / "ray_bootstrap_config.yaml")
    parser.add_argument("--ray-logs", type=Path, default=Path("/tmp/ray/session_latest/logs"),
                        help="the autoscaler's log folder (monitor.out, monitor.err)")
    parser.add_argument("--max", type=int, default=int(os.environ.get("RERANK_LAB_MAX_SETUP_FAILURES", "3")))
    parser.add_argument("--window", type=float, default=7200.0, help="seconds")
    parser.add_argument("--every", type=float, default=30.0, help="seconds between checks")
    parser.add_argument("--once", action="store_true", help="check once and exit")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    autoscaler_log = AutoscalerLog(args.ray_logs)
    while True:
        check_once(args.failures, args.config, args.max, args.window, autoscaler_log=autoscaler_log)
        if args.once:
            return 0
        time.sleep(args.every)


if __name__ == "__main__":
    sys.exit(main())
