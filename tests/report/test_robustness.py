"""The robustness table: perturbed vs clean on the queries both contain, systems against the first row."""

from dataclasses import dataclass

import pytest

from orchestrator.report.robustness import perturbed_vs_clean, robustness_table
from orchestrator.report.tables import render_markdown
from workloads.significance import paired_test


@dataclass
class _Evaluation:
    values: dict


class _Reader:
    """Stands in for RunReader: run -> prefix -> metric -> query -> value."""

    def __init__(self, runs):
        self.runs = runs

    def per_query(self, run, prefix):
        values = self.runs[run].get(prefix)
        return None if values is None else _Evaluation(values)


CLEAN = {"ap": {"q1": 1.0, "q2": 0.5, "q3": 0.25, "q4": 1.0}, "p_at_1": {"q1": 1.0, "q2": 0.0, "q3": 0.0, "q4": 1.0}}
TYPO = {"ap": {"q1": 0.5, "q2": 0.5, "q3": 0.2, "q4": 0.5}, "p_at_1": {"q1": 0.0, "q2": 0.0, "q3": 0.0, "q4": 0.0}}
CONTRACTION = {"ap": {"q2": 0.25, "q4": 1.0}, "p_at_1": {"q2": 0.0, "q4": 1.0}}  # a subset of the queries
OTHER_CLEAN = {"ap": {"q1": 1.0, "q2": 1.0, "q3": 0.5, "q4": 1.0}, "p_at_1": {"q1": 1.0, "q2": 1.0, "q3": 0.0, "q4": 1.0}}


def _reader():
    return _Reader({"mhl": {"test_": CLEAN, "robust_typo_": TYPO, "robust_contraction_": CONTRACTION},
                    "tml": {"test_": OTHER_CLEAN, "robust_typo_": CLEAN, "robust_contraction_": CONTRACTION}})


def test_a_perturbed_set_is_compared_with_the_clean_values_of_its_own_queries():
    measured = {(m.perturbation, m.metric): m for m in perturbed_vs_clean(_reader(), "mhl", ["typo", "contraction"])}
    contraction = measured[("contraction", "ap")]
    # clean AP on q2 and q4 only: (0.5 + 1.0) / 2, not the clean mean over all four queries (0.6875)
    assert contraction.clean_on_same_queries == pytest.approx(0.75) and contraction.perturbed == pytest.approx(0.625)
    assert contraction.queries == 2 and contraction.drop == pytest.approx(-0.125)
    typo = measured[("typo", "ap")]
    assert typo.clean_on_same_queries == pytest.approx(0.6875) and typo.perturbed == pytest.approx(0.425)
    assert typo.p_value == pytest.approx(paired_test(TYPO["ap"], CLEAN["ap"]).p_value)


def test_the_table_shows_clean_and_perturbed_map_and_p_at_1_and_compares_systems():
    table = robustness_table(_reader(), [("mhl", "mhl"), ("mhl+tml", "tml"), ("not run", None)], ["typo", "contraction"], "t")
    assert table.columns == ["clean AP", "clean P@1", "typo AP", "typo P@1", "contraction AP", "contraction P@1"]
    mhl = dict(zip(table.columns, table.rows[0][1]))
    assert mhl["clean AP"].value == pytest.approx(0.6875) and mhl["clean AP"].relative is None
    assert mhl["contraction AP"].value == pytest.approx(0.625)
    assert mhl["contraction AP"].relative == pytest.approx(100 * (0.625 - 0.75) / 0.75)  # vs clean on the same queries
    assert [e.status for e in table.rows[2][1]] == ["missing"] * 6
    between = next(n for n in table.notes if n.startswith("mhl+tml vs mhl"))
    expected = paired_test(OTHER_CLEAN["ap"], CLEAN["ap"])
    assert f"clean AP {expected.difference:+.4f} (p = {expected.p_value:.3g})" in between
    assert "Queries: clean 4, typo 4, contraction 2." in table.notes
    text = render_markdown(table)
    assert "| mhl | 0.6875 | 0.5000 |" in text and "missing" in text
