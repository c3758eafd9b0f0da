"""What a sweep shows while it runs, without Ray: the search's progress line (trials Tune retries
counted once) and the winners' tests taken as they end, their ETA queued on the slots that free."""

import io
from pathlib import Path
from types import SimpleNamespace

import pytest

from orchestrator.core.config import load_trials
from orchestrator.sweep import winners
from orchestrator.sweep.tune import MlflowTrialLogger, SweepProgress
from tests.sweep.test_faults import _RecordingTracker
from workloads.kinds.rerank.spec import TrialSpec

REPO = Path(__file__).resolve().parents[2]


def test_a_retried_trial_is_one_running_trial_on_the_progress_line():
    """Tune starts a trial again after a failure it retries (max_failures), with no end between
    (its controller calls on_trial_recover, then on_trial_start): the line counts trials, not
    starts, and a trial waiting for its retry is not running."""
    stream = io.StringIO()
    display = SweepProgress("tiny", {"cell-a": 0, "cell-b": 0}, trials_per_cell=1, stream=stream)
    logger = MlflowTrialLogger(_RecordingTracker([]), "1", {}, None, display, None)
    logger.runs = {"t1": "run-1", "t2": "run-2"}
    one, two = SimpleNamespace(trial_id="t1"), SimpleNamespace(trial_id="t2")
    logger.on_trial_start(0, [], one)
    logger.on_trial_start(0, [], two)
    logger.on_trial_recover(0, [], two)  # failed; Tune retries it
    assert display.line().startswith("[sweep] tiny: cells 0/2 done | trials 0/2 done, 1 running, 0 failed")
    logger.on_trial_start(0, [], two)
    assert "trials 0/2 done, 2 running" in display.line()
    display.trial_ended("t1", "cell-a", failed=False)
    display.trial_ended("t2", "cell-b", failed=True)
    assert display.line().startswith("[sweep] tiny: cells 2/2 done | trials 2/2 done, 0 running, 1 failed")


class _FakeRay:
    """ray.wait over refs named by when they end: a look (timeout=0) sees what has ended; a
    blocking wait lets the next moment come."""

    def __init__(self, ends_at: dict[str, int]):
        self.ends_at, self.now, self.blocking_waits = ends_at, 0, 0

    def wait(self, refs, num_returns=1, timeout=None, fetch_local=True):
        if timeout != 0:
            self.blocking_waits += 1
            self.now += 1
        ready = [r for r in refs if self.ends_at[r] <= self.now]
        return ready, [r for r in refs if r not in ready]


def test_cells_come_as_all_their_tests_end_each_with_when_it_was_seen_ended(monkeypatch):
    import ray

    fake = _FakeRay({"a1": 2, "a2": 3, "b1": 1, "c1": 3, "d1": 0})
    monkeypatch.setattr(ray, "wait", fake.wait)
    clock = iter([10.0, 11.0, 13.0])  # the moments each cell (or cells together) were seen ended
    monkeypatch.setattr(winners.time, "perf_counter", lambda: next(clock))
    cells = {name: (name, None, None, None, None, [SimpleNamespace(ref=r) for r in refs], None)
             for name, refs in {"A": ["a1", "a2"], "B": ["b1"], "C": ["c1"], "D": ["d1"]}.items()}
    order = [(entry[0], seen) for entry, seen in winners.in_completion_order(list(cells.values()), started=10.0)]
    # D had ended already; B next; A's second test and C end together: one moment for both
    assert order == [("D", 0.0), ("B", 1.0), ("A", 3.0), ("C", 3.0)]
    assert fake.blocking_waits == 3  # one per moment a test ended, none while a cell was ready


@pytest.mark.parametrize("ends, now, eta", [
    ([], 0.0, 0.0),  # nothing ended: no estimate (the line is written after a cell ends)
    ([139.0], 139.0, 278.0),  # first of a wave of 2: two more waves of 139 s after the second cell's start
    ([139.0, 146.0], 146.0, 285.0),  # the wave done: cells 3-6 from 139 s and 146 s, 142.5 s each
    ([255.0, 255.0], 255.0, 510.0),  # a wave ended together (the fp32 demo: 8m13s were left)
    ([139.0, 146.0, 280.0], 280.0, 150.0),  # the third ran from 139 s: 141 s; cells 4-6 from 146, 280 and 288 s
    ([139.0, 146.0, 280.0, 291.0, 420.0, 431.0], 431.0, 0.0),  # all tested
])
def test_the_winners_eta_queues_the_cells_left_on_the_slots_that_free(ends, now, eta):
    assert winners.testing_eta(ends, cells=6, slots=2, now=now) == pytest.approx(eta)


def test_a_cell_left_that_should_have_ended_ends_no_earlier_than_now():
    # 2 cells side by side, the first ended at 6 s; the other, running as long, is about to end
    assert winners.testing_eta([6.0], cells=2, slots=2, now=6.0) == 0.0
    assert winners.testing_eta([6.0], cells=3, slots=1, now=9.0) == pytest.approx(9.0)  # 2 left, one at a time from 6 s
    # the second cell, due at 6 s, still runs at 10 s: the slot it holds frees no earlier than now
    assert winners.testing_eta([6.0], cells=4, slots=2, now=10.0) == pytest.approx(6.0)


def test_cells_tested_at_once_is_the_room_for_one_test_task_over_the_tests_per_cell(monkeypatch):
    asked = []

    def capacity(spec):
        asked.append(spec.resources.workers)
        return SimpleNamespace(trials=8 // spec.resources.cpus_per_worker)

    monkeypatch.setattr(winners, "trial_capacity", capacity)
    spec = load_trials(REPO / "search_spaces" / "trials" / "rq1-scifact.yaml", TrialSpec)[1][0]
    spec = spec.model_copy(update={"resources": spec.resources.model_copy(update={"workers": 4, "cpus_per_worker": 2})})
    cell = SimpleNamespace(spec=spec)
    assert winners.cells_tested_at_once([(cell, None, None, None, None, [1, 2], None)] * 3) == 2  # 4 tasks, 2 tests a cell
    assert asked == [1]  # a test is one worker, whatever the trial's workers; the cluster asked once per shape
    assert winners.cells_tested_at_once([(cell, None, None, None, None, [1] * 9, None)]) == 1
