"""Query perturbations (CFT's CheckList rules): hand cases, determinism across processes, subsets."""

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import run_cli
from tests.workloads.retrieval.test_wikiqa_and_first_stages import write_wikiqa
from workloads.text.perturbations import PERTURBATIONS, contraction, perturb_queries, punctuation, query_rng, typo

REPO = Path(__file__).resolve().parents[3]


def test_punctuation_strips_trailing_punctuation_or_adds_a_period():
    rng = random.Random(0)
    assert punctuation("how are glacier caves formed ?", rng) == "how are glacier caves formed"  # WikiQA's tokenised "?"
    assert punctuation("What is a cat?!", rng) == "What is a cat"
    assert punctuation("HOW AFRICAN AMERICANS WERE IMMIGRATED TO THE US", rng) == "HOW AFRICAN AMERICANS WERE IMMIGRATED TO THE US."
    assert punctuation("what purrs ", rng) == "what purrs."
    assert punctuation("?", rng) == "?."  # nothing but punctuation: stripping would leave no query


def test_typo_swaps_exactly_two_adjacent_different_characters():
    for seed in range(50):
        query = "who wrote hamlet"
        variant = typo(query, random.Random(seed))
        diff = [i for i, (a, b) in enumerate(zip(query, variant)) if a != b]
        assert len(variant) == len(query) and len(diff) == 2 and diff[1] == diff[0] + 1
        assert variant[diff[0]] == query[diff[1]] and variant[diff[1]] == query[diff[0]]
    assert typo("aaaa", random.Random(0)) is None and typo("a", random.Random(0)) is None
    assert typo("aab", random.Random(0)) == "aba"  # the only position whose characters differ


def test_contraction_expands_or_contracts_keeping_case_and_skips_queries_without_any():
    rng = random.Random(0)
    assert contraction("what's the capital of france", rng) == "what is the capital of france"
    assert contraction("What is a cat", rng) == "What's a cat"
    assert contraction("WHAT IS A CAT", rng) == "WHAT'S A CAT"
    assert contraction("who won't play", rng) == "who will not play"
    assert contraction("how many legs does a spider have", rng) is None  # nothing to change: no variant
    assert contraction("whatsoever is nothing", rng) is None  # word boundaries: "whatsoever is" is not "what is"
    both = {contraction("it's what is left", random.Random(s)) for s in range(20)}
    assert both == {"it is what is left", "it's what's left"}  # both directions possible: the RNG picks one


def test_perturbed_sets_are_deterministic_across_processes_and_contraction_is_a_strict_subset():
    queries = {f"q{i}": text for i, text in enumerate(
        ["what is a cat", "how are glacier caves formed ?", "who's the king", "where do eels spawn", "WHEN IS EASTER"])}
    script = ("import json, sys; from workloads.text.perturbations import perturb_queries; "
              f"q = {queries!r}; print(json.dumps({{p: perturb_queries(q, p) for p in ('punctuation', 'typo', 'contraction')}}))")
    outputs = {subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=True,
                              env={"PYTHONHASHSEED": str(seed), "PATH": ""}).stdout for seed in (1, 2)}
    assert len(outputs) == 1  # another process with another hash seed: the same variants

    variants = json.loads(outputs.pop())
    assert variants == {p: perturb_queries(queries, p) for p in PERTURBATIONS}
    assert set(variants["punctuation"]) == set(queries) and set(variants["typo"]) == set(queries)
    assert set(variants["contraction"]) == {"q0", "q2", "q4"} < set(queries)
    assert all(variants[p][q] != queries[q] for p in variants for q in variants[p])
    # one RNG per (perturbation, query, seed): adding queries changes no earlier variant
    assert perturb_queries({**queries, "new": "what is new"}, "typo")["q1"] == variants["typo"]["q1"]
    assert query_rng("typo", "q1", 0).random() != query_rng("typo", "q1", 1).random()


def test_unknown_perturbation_is_an_error():
    with pytest.raises(ValueError, match="unknown perturbation 'shout'"):
        perturb_queries({"q": "x"}, "shout")


def test_the_perturb_command_shows_originals_and_variants_and_refuses_bad_input(tmp_path):
    root = write_wikiqa(tmp_path / "wikiqa")

    def perturb(*args):
        return run_cli(REPO, "perturb", str(root), *args)

    shown = perturb("--split", "test-unfiltered", "--show", "2")
    assert shown.returncode == 0, shown.stderr
    assert "test-unfiltered: 4 queries; variants: punctuation 4, typo 4, contraction 2" in shown.stdout
    assert "Q2  original     what is a cat" in shown.stdout and "contraction  what's a cat" in shown.stdout
    assert "punctuation  what is a cat." in shown.stdout
    for args, message in ((["--perturbations", "shout"], "unknown perturbation 'shout'"), (["--split", "nope"], "no split 'nope'")):
        bad = perturb(*args)
        assert bad.returncode == 2 and bad.stdout == "" and message in bad.stderr
        assert len(bad.stderr.strip().splitlines()) == 1 and "Traceback" not in bad.stderr
