"""What a sweep shows while it runs, without Ray: the search's progress line (trials Tune retries
counted once) and the winners' tests taken as they end, with the pace for the ETA."""

import io
from types import SimpleNamespace

from orchestrator.sweep import winners
from orchestrator.sweep.tune import MlflowTrialLogger, SweepProgress
from tests.sweep.test_faults import _RecordingTracker


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


def test_cells_come_as_all_their_tests_end_with_how_many_had_ended_by_then(monkeypatch):
    import ray

    fake = _FakeRay({"a1": 2, "a2": 3, "b1": 1, "c1": 3, "d1": 0})
    monkeypatch.setattr(ray, "wait", fake.wait)
    cells = {name: (name, None, None, None, None, [SimpleNamespace(ref=r) for r in refs], None)
             for name, refs in {"A": ["a1", "a2"], "B": ["b1"], "C": ["c1"], "D": ["d1"]}.items()}
    order = [(entry[0], ended) for entry, ended in winners.in_completion_order(list(cells.values()))]
    # D had ended already; B next; A's second test and C end together: both count at once
    assert order == [("D", 1), ("B", 2), ("A", 4), ("C", 4)]
    assert fake.blocking_waits == 3  # one per moment a test ended, none while a cell was ready

