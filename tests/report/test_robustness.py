"""The robustness table: perturbed vs clean on the queries both contain, systems against the first row."""

import re
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pytest

from orchestrator.report.render import render_csv, render_markdown
from orchestrator.report.results import STATUS_OK
from orchestrator.report.robustness import perturbed_vs_clean, robustness_table, sweep_robustness
from tests.workloads.evaluation.test_statistics import _crossed_reference, _t_reference
from workloads.evaluation.significance import adjust_p_values, paired_test


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


SEED_14 = {  # a second seed of each system, with values of its own
    "mhl": {"test_": {"ap": {"q1": 0.5, "q2": 1.0, "q3": 0.5, "q4": 0.25}, "p_at_1": {"q1": 0.0, "q2": 1.0, "q3": 0.0, "q4": 0.0}},
            "robust_typo_": {"ap": {"q1": 1.0, "q2": 0.25, "q3": 0.5, "q4": 0.5},
                             "p_at_1": {"q1": 1.0, "q2": 0.0, "q3": 0.0, "q4": 0.0}}},
    "tml": {"test_": {"ap": {"q1": 0.25, "q2": 0.5, "q3": 1.0, "q4": 1.0}, "p_at_1": {"q1": 0.0, "q2": 0.0, "q3": 1.0, "q4": 1.0}},
            "robust_typo_": {"ap": {"q1": 0.5, "q2": 0.5, "q3": 1.0, "q4": 0.2},
                             "p_at_1": {"q1": 0.0, "q2": 0.0, "q3": 1.0, "q4": 0.0}}},
}


def _mean(*tables):
    return {m: {q: sum(t[m][q] for t in tables) / len(tables) for q in tables[0][m]} for m in tables[0]}


def test_a_system_of_two_seeds_is_one_row_of_per_query_means():
    """Each seed's values differ: the row, its perturbed-vs-clean test and its comparison with the
    reference all use the per-query means over the seeds (not the last seed's values, and the
    reference is never compared with its own second seed)."""
    reader = _Reader({"mhl-13": {"test_": CLEAN, "robust_typo_": TYPO}, "mhl-14": SEED_14["mhl"],
                      "tml-13": {"test_": OTHER_CLEAN, "robust_typo_": CLEAN}, "tml-14": SEED_14["tml"]})
    table = robustness_table(reader, [("mhl", ["mhl-13", "mhl-14"]), ("mhl+tml", ["tml-13", "tml-14"])], ["typo"], "t")
    assert [keys for keys, _ in table.rows] == [["mhl"], ["mhl+tml"]]
    mhl_clean, mhl_typo = _mean(CLEAN, SEED_14["mhl"]["test_"]), _mean(TYPO, SEED_14["mhl"]["robust_typo_"])
    tml_clean = _mean(OTHER_CLEAN, SEED_14["tml"]["test_"])
    mhl = dict(zip(table.columns, table.rows[0][1]))
    assert mhl["clean AP"].value == pytest.approx(sum(mhl_clean["ap"].values()) / 4)
    assert mhl["typo AP"].value == pytest.approx(sum(mhl_typo["ap"].values()) / 4)
    assert mhl["typo AP"].p_value == pytest.approx(paired_test(mhl_typo["ap"], mhl_clean["ap"]).p_value)
    between = next(n for n in table.notes if n.startswith("mhl+tml vs mhl"))
    expected = paired_test(tml_clean["ap"], mhl_clean["ap"])
    assert f"clean AP {expected.difference:+.4f} (p = {expected.p_value:.3g})" in between
    assert not any(n.startswith("mhl vs mhl") for n in table.notes)
    assert any("per-query means over its seeds" in n and "mhl 2" in n for n in table.notes)


def test_a_sweeps_robustness_rows_are_systems_with_their_seeds():
    def cell(loss, seed, run, status=STATUS_OK):
        return SimpleNamespace(axes={"model": "m", "loss": loss, "augmentation": "none", "size": "full", "seed": seed},
                               run=run, status=status)

    reader = _Reader({"mhl-13": {"test_": CLEAN, "robust_typo_": TYPO}, "mhl-14": SEED_14["mhl"],
                      "tml-13": {"test_": OTHER_CLEAN, "robust_typo_": CLEAN}, "tml-14": SEED_14["tml"]})
    results = SimpleNamespace(sweep=SimpleNamespace(name="s", base={"robustness": ["typo"]}), reader=reader,
                              cells=[cell("mhl", "13", "mhl-13"), cell("mhl", "14", "mhl-14"), cell("tml", "13", "tml-13"),
                                     cell("tml", "14", "tml-14", status="running")])
    table = sweep_robustness(results)
    assert [keys for keys, _ in table.rows] == [["m / mhl / none / full"]]  # tml waits for its second seed
    row = dict(zip(table.columns, table.rows[0][1]))
    assert row["clean AP"].value == pytest.approx(sum(_mean(CLEAN, SEED_14["mhl"]["test_"])["ap"].values()) / 4)


def test_robustness_table_takes_the_correction_intervals_and_seeds():
    """Holm over the table's perturbed-vs-clean comparisons, the interval of each perturbed-minus-
    clean difference (seed by seed), and each seed's value."""

    plain = robustness_table(_reader(), [("mhl", "mhl"), ("mhl+tml", "tml")], ["typo", "contraction"], "t")
    table = robustness_table(_reader(), [("mhl", "mhl"), ("mhl+tml", "tml")], ["typo", "contraction"], "t",
                             correction="holm", ci=True)
    raw = [e.p_value for _, entries in plain.rows for e in entries if e.p_value is not None]
    corrected = [e.p_value for _, entries in table.rows for e in entries if e.p_value is not None]
    assert len(raw) == 8 and corrected == pytest.approx(adjust_p_values(raw, "holm"))
    family = next(n for n in table.notes if n.startswith("Multiple comparisons"))
    assert int(re.search(r"(\d+) comparisons", family).group(1)) == len(raw) and "Holm" in family
    typo = dict(zip(table.columns, table.rows[0][1]))["typo AP"]
    d = np.array([TYPO["ap"][q] - CLEAN["ap"][q] for q in sorted(CLEAN["ap"])])
    assert typo.ci == pytest.approx(_t_reference(d), abs=1e-12)
    assert (typo.direction.won, typo.direction.tied, typo.direction.lost) == (0, 1, 3)
    assert "ci_low" in render_csv(table).splitlines()[0]
    # two seeds: seed by seed against their own clean values; the spread of each column
    reader = _Reader({"mhl-13": {"test_": CLEAN, "robust_typo_": TYPO}, "mhl-14": SEED_14["mhl"]})
    seeded = robustness_table(reader, [("mhl", ["mhl-13", "mhl-14"])], ["typo"], "t", ci=True, show_seeds=True)
    row = dict(zip(seeded.columns, seeded.rows[0][1]))
    means = [sum(v["ap"].values()) / 4 for v in (CLEAN, SEED_14["mhl"]["test_"])]
    assert row["clean AP"].seed_std == pytest.approx(abs(means[0] - means[1]) / np.sqrt(2))
    d = np.array([[run["robust_typo_"]["ap"][q] - run["test_"]["ap"][q] for q in sorted(CLEAN["ap"])]
                  for run in ({"test_": CLEAN, "robust_typo_": TYPO}, SEED_14["mhl"])])
    assert row["typo AP"].ci == pytest.approx(tuple(_crossed_reference(d)), abs=1e-12)
    assert "each seed" in render_markdown(seeded)
