"""The chaos test, fast variant: one seed of benchmarks/_chaos.py's fault schedule (a SIGKILL
of the driver, of a Tune trial process and of a Ray Train worker at seeded moments, a full disk
at a seeded write), each followed by a rerun of the same `orchestrate sweep`, against the same
grid run without faults. benchmarks/chaos.py runs more seeds."""

from pathlib import Path

import pytest

from benchmarks._chaos import (
    CHECKS,
    Sweep,
    chaos_grid,
    clean_run,
    compare,
    differences,
    faulted_run,
    half_written,
    outcome,
    outside_snapshot,
    report,
    schedule,
    untouched,
)

pytestmark = pytest.mark.slow  # Ray, Tune and MLflow end to end

REPO = Path(__file__).resolve().parents[2]
SEED = 1  # its schedule kills the driver (every seed's does), a trial and a Train worker, and fills the disk once


# the driver is killed with the Ray it started, as in a crash: on a shared head the killed
# driver's workers would outlive it (tests/sweep/test_selector_sweep.py)
@pytest.mark.own_ray
def test_faults_at_seeded_moments_then_reruns_end_as_the_run_without_faults(tmp_path, tiny_model_dir, scifact_dir, shared_cache):
    faults = schedule(SEED)
    assert {f.kind for f in faults} == {"driver", "trial", "train_worker", "enospc"}
    reference_work, faulted_work = tmp_path / "reference", tmp_path / "faulted"
    reference_work.mkdir()
    faulted_work.mkdir()
    reference = Sweep(chaos_grid(reference_work / "chaos.yaml", tiny_model_dir), reference_work, shared_cache=shared_cache)
    assert clean_run(reference) == 0, (reference_work / "run0.err").read_text()[-3000:]
    expected = outcome(reference)
    kinds = [kind for kind, _ in expected["keys"]]
    assert (kinds.count("sweep"), kinds.count("cell"), kinds.count("trial")) == (1, 2, 4)
    assert set(expected["statuses"]) == {"FINISHED"} and len(expected["test"]) == 2

    sweep = Sweep(chaos_grid(faulted_work / "chaos.yaml", tiny_model_dir), faulted_work, shared_cache=shared_cache)
    before, leftovers = outside_snapshot(faulted_work, REPO, scifact_dir), half_written(shared_cache)
    runs = faulted_run(sweep, faults)
    outside = untouched(before, outside_snapshot(faulted_work, REPO, scifact_dir))
    got = outcome(sweep)
    checks = compare(expected, got, sweep, runs, outside, leftovers)
    assert all(f.injected for f in faults), report(faults, checks, runs)
    assert any(f.kind == "trial" and "ray::ImplicitFunc" in f.detail for f in faults)  # what was killed: named by title
    assert any(f.kind == "train_worker" and "ray::RayTrainWorker" in f.detail for f in faults)
    # the bar: the same runs by key, winners and values bit for bit as without faults, and the rest
    assert all(checks[check] for check in CHECKS), (report(faults, checks, runs), differences(expected, got))
