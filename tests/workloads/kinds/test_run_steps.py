"""The one lifecycle (``workloads.kinds.run_steps``): every setting (in process, on Ray with the
run store) gets its steps called in one order, the epoch chosen by the one rule, and a failing
step closes what was started; a reused result skips every step."""

from dataclasses import dataclass

import pytest

import workloads.kinds.lifecycle as lifecycle
from workloads.kinds import run_steps


@dataclass
class Epoch:
    metrics: dict
    checkpoint: str


class Recorded:
    """Steps that record their calls; ``fail_at`` raises in that step."""

    def __init__(self, reused=None, fail_at: str | None = None) -> None:
        self.calls: list[tuple] = []
        self._reused, self.fail_at = reused, fail_at

    def _step(self, name: str, *args):
        self.calls.append((name, *args))
        if name == self.fail_at:
            raise RuntimeError(f"{name} failed")

    def reused(self, kind, spec):
        self._step("reused")
        return self._reused

    def require(self, kind, spec, required):
        self._step("require", tuple(required))

    def prepare(self, kind, spec):
        self._step("prepare")
        return "prepared"

    def train(self, kind, spec, prepared):
        self._step("train", prepared)
        return [Epoch({"epoch": 1, "val_ndcg_at_10": 0.2}, "e1"), Epoch({"epoch": 2, "val_ndcg_at_10": 0.5}, "e2"),
                Epoch({"epoch": 3, "val_ndcg_at_10": 0.4}, "e3")]

    def test(self, kind, spec, prepared, chosen):
        self._step("test", chosen.checkpoint)
        return ["own target", "zero-shot target"]

    def keep(self, kind, spec, chosen, tested):
        self._step("keep", chosen.checkpoint, tested[0])
        return "kept"

    def log(self, kind, spec, epochs, chosen, tested, kept):
        self._step("log", len(epochs), chosen.checkpoint, kept)
        return "outcome"

    def stopped(self, error):
        self.calls.append(("stopped", str(error)))


@pytest.fixture
def a_kind(monkeypatch):
    """A spec whose kind requires one trial (the registry's lookups stand in for a real kind)."""
    monkeypatch.setattr(lifecycle, "kind_of", lambda spec: "the kind")
    monkeypatch.setattr(lifecycle, "requirements", lambda specs: ["required trial"])
    return object()


def test_every_step_in_the_one_order_with_the_epoch_chosen_on_validation(a_kind):
    steps = Recorded()
    assert run_steps(a_kind, steps) == "outcome"
    assert steps.calls == [("reused",), ("require", ("required trial",)), ("prepare",), ("train", "prepared"),
                           ("test", "e2"), ("keep", "e2", "own target"), ("log", 3, "e2", "kept")]


def test_a_reused_result_runs_no_step(a_kind):
    steps = Recorded(reused="kept before")
    assert run_steps(a_kind, steps) == "kept before"
    assert steps.calls == [("reused",)]


@pytest.mark.parametrize("failing", ["train", "test", "keep", "log"])
def test_a_failing_step_after_prepare_is_closed_and_raised(a_kind, failing):
    steps = Recorded(fail_at=failing)
    with pytest.raises(RuntimeError, match=f"{failing} failed"):
        run_steps(a_kind, steps)
    assert steps.calls[-1] == ("stopped", f"{failing} failed")
    assert [c[0] for c in steps.calls].count("stopped") == 1
