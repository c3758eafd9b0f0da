"""The hand trace of a demo sweep, measured: how often reading ``orchestrate sweep`` call by call
moves between the project's modules, and how often it comes back to a module it already left.

Issue 46 traced ``orchestrate sweep search_spaces/demo.yaml`` by hand from
``orchestrator/cli/sweep.py`` through every call. This does the same mechanically: it runs a
demo-like sweep (the demo's grid shape: 2 contrastive losses x bm25/GloVe augmentations + a
pointwise baseline, one size, one trial per cell, a tiny random BERT on SciFact) in this process
under :func:`sys.setprofile`, and reads the calls as a person would:

- only the project's functions count (modules ``orchestrator.*`` and ``workloads.*``); other
  code is transparent (Tune calling the searcher is the reader going from the module that
  started Tune into the searcher's module);
- a function is read once: its first call is followed, later calls of it (and what they call)
  are not; imports (module bodies) are not followed;
- the reader starts in ``orchestrator.cli.sweep.run``; each arrival in another module is a
  *stop* (a call into it, or a return back to the caller's module); a stop in a module the
  reader was in before is a *return to a module already left*.

Only the driver is traced (Ray's workers run the trials in their own processes; the hand trace
read ``_sweep_trial`` too, so its counts are of a larger reading).

    ORCHESTRATE_DATA_DIR=/work/shared/data python benchmarks/trace_modules.py [--json] [--sequence]

To measure another checkout, run this file with that checkout first on ``PYTHONPATH`` and as the
working directory (it imports nothing of the project before the sweep starts).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from _in_process import tiny_model  # benchmarks/ is sys.path[0]

PROJECT = ("orchestrator.", "workloads.")
START = ("orchestrator.cli.sweep", "run")


class ModuleTrace:
    """A profile function (``sys.setprofile``) that keeps the reader's place among the project's modules."""

    def __init__(self):
        self.read: set = set()  # code objects already read
        self.stack: list[str | None] = []  # per Python frame: the module the reader is in while it runs (None: not followed)
        self.skipping = 0  # > 0 inside a call that is not followed (read before, or an import)
        self.started = False
        self.ended = False
        self.sequence: list[str] = []  # the module of every stop, in order
        self.stops: list[str] = []  # each stop as "module:function" (a call) or "module <-" (a return)

    def _arrive(self, module: str, function: str | None = None) -> None:
        if not self.sequence or self.sequence[-1] != module:
            self.sequence.append(module)
            self.stops.append(f"{module}:{function}" if function else f"{module} <-")

    def __call__(self, frame, event, arg):
        if self.ended:
            return
        if event == "call":
            if self.skipping:
                self.skipping += 1
                return
            code = frame.f_code
            module = frame.f_globals.get("__name__", "")
            if not self.started:
                if (module, code.co_name) != START:
                    return
                self.started = True
            if code.co_name == "<module>":  # an import: not part of the reading
                self.skipping = 1
                return
            if not module.startswith(PROJECT) and module != START[0]:
                self.stack.append(self.stack[-1] if self.stack else None)  # transparent: the reader stays where it is
                return
            if code in self.read:
                self.skipping = 1
                return
            self.read.add(code)
            self.stack.append(module)
            self._arrive(module, code.co_qualname)
        elif event == "return":
            if self.skipping:
                self.skipping -= 1
                return
            if not self.stack:
                return
            self.stack.pop()
            if not self.stack:  # orchestrator.cli.sweep.run returned: the reading ends
                self.ended = True
            elif self.stack[-1] is not None:
                self._arrive(self.stack[-1])

    def counts(self) -> dict:
        seen: set[str] = set()
        returns = 0
        for module in self.sequence:
            returns += module in seen
            seen.add(module)
        return {"modules": len(seen), "stops": len(self.sequence), "returns_to_a_module_left": returns}


def demo_like_sweep(path: Path, model: Path) -> Path:
    """search_spaces/demo.yaml's shape, sized to minutes on 2 CPU cores."""
    import yaml

    glove = Path(os.environ["ORCHESTRATE_DATA_DIR"]) / "glove" / "glove.6B.50d.top100k.txt.gz"
    path.write_text(yaml.safe_dump({
        "name": "trace-demo",
        "base": {"data": {"collection": "beir/scifact", "validation_queries": 5},
                 "first_stage": {"train_depth": 10, "validation_depth": 5, "test_depth": 3},
                 "optimization": {"epochs": 1, "batch_size": 8},
                 "resources": {"workers": 1, "cpus_per_worker": 1}},
        "grid": {"models": [str(model)], "max_length": 64,
                 "losses": [{"ranking": "pointwise", "contrastive": "scl"}, {"ranking": "pointwise", "contrastive": "ctriplet"}],
                 "augmentations": [{"method": "bm25", "k": 2}, {"method": "glove", "k": 2, "glove_path": str(glove)}],
                 "sizes": [16], "seeds": [13]},
        "search": {"trials_per_cell": 1, "sampler_seed": 13, "pruner": "none",
                   "learning_rate": {"low": 5.0e-5, "high": 3.0e-4, "log": True}, "lambda": {"low": 0.1, "high": 0.7},
                   "tau": {"low": 0.05, "high": 0.5, "log": True}, "contrastive_margin": {"low": 0.2, "high": 1.0},
                   "k": {"choices": [2, 3]}},
        "max_failures": 1,
    }))
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="the counts as JSON")
    parser.add_argument("--sequence", action="store_true", help="also print the modules of every stop, in order")
    args = parser.parse_args()
    if "ORCHESTRATE_DATA_DIR" not in os.environ:
        parser.error("set ORCHESTRATE_DATA_DIR (SciFact and GloVe)")
    with tempfile.TemporaryDirectory(prefix="trace-modules-") as work:
        work = Path(work)
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ["ORCHESTRATE_CACHE_DIR"] = str(work / "cache")  # a fresh cache: every reading prepares the same data
        model = tiny_model(work / "tiny-bert")
        sweep = demo_like_sweep(work / "trace-demo.yaml", model)
        import io

        from orchestrator import cli
        from orchestrator.cli import output

        results = io.StringIO()  # the sweep's own report; fd 1 stays this script's

        def route_results():
            output._result_stream = results

        output.route_results = route_results
        if hasattr(cli, "route_results"):  # (imported by name there)
            cli.route_results = route_results
        trace = ModuleTrace()
        argv = ["sweep", str(sweep), "--storage", str(work / "store"), "--tracking-uri", f"sqlite:///{work / 'mlflow.db'}",
                "--json"]
        sys.setprofile(trace)
        try:
            code = cli.main(argv)
        finally:
            sys.setprofile(None)
    counts = {"exit_code": code, **trace.counts(), "root": str(Path(cli.__file__).resolve().parents[2])}
    if args.sequence:
        counts["sequence"] = trace.stops
    print(json.dumps(counts, indent=1) if args.json else
          f"{counts['modules']} modules, {counts['stops']} stops, {counts['returns_to_a_module_left']} returns to a module "
          f"already left (exit {code}; {counts['root']})")
    return 0 if code == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
