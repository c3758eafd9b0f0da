"""Inputs that once ended in a traceback, were accepted silently, or were refused in words that
did not say why (issue 42): each is now one ``error:`` line naming the file or option, exit 2,
before any work and with nothing cached; and two commands that build the same cache entry at
once build it once."""

import json
import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.cli.test_offline import assert_one_clear_line
from tests.helpers import free_port, run_cli
from workloads.data.resolve import resolve_collection
from workloads.retrieval import bm25

SCIFACT = "beir/scifact"


def cli(cwd: Path, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return run_cli(cwd, *args, timeout=timeout)  # in process: these are the command's answers, not the interpreter's


def _beir(root: Path, documents: dict[str, str], queries: dict[str, str], qrels: dict[str, str]) -> Path:
    (root / "qrels").mkdir(parents=True)
    (root / "corpus.jsonl").write_text("".join(json.dumps({"_id": d, "text": t}) + "\n" for d, t in documents.items()))
    (root / "queries.jsonl").write_text("".join(json.dumps({"_id": q, "text": t}) + "\n" for q, t in queries.items()))
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t1\n" for q, d in qrels.items()))
    return root


@pytest.fixture()
def kappa(tmp_path) -> Path:
    """30 documents and queries, each query finding its own document, with one expansion each in a
    file (``expansions.jsonl``, next to the collection)."""
    root = _beir(tmp_path / "kappa", {f"d{i}": f"report on kappa{i} filed today" for i in range(30)},
                 {f"q{i}": f"kappa{i} report" for i in range(30)}, {f"q{i}": f"d{i}" for i in range(30)})
    (root / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\td{i}\t1\n" for i in range(30, 60)))
    with open(root / "queries.jsonl", "a") as out:  # training queries, for an EAR trial on it
        out.write("".join(json.dumps({"_id": f"q{i}", "text": f"kappa{i - 30} report"}) + "\n" for i in range(30, 60)))
    (tmp_path / "expansions.jsonl").write_text("".join(json.dumps({"query_id": f"q{i}", "expansion": f"kappa{(i + 1) % 30} x"})
                                                       + "\n" for i in range(30)))
    return root


def _expand(tmp_path: Path, root: Path, path: Path, *extra: str) -> subprocess.CompletedProcess:
    return cli(tmp_path, "expand", "--dataset", str(root), "--source", "file", "--path", str(path), "--n", "1", *extra)


def _searched(proc: subprocess.CompletedProcess) -> bool:
    return "[bm25]" in proc.stderr  # Anserini's index or search ran


# ----------------------------------------------------------------------------- expansions files


def test_an_expansions_file_that_is_not_utf8_names_the_byte_and_its_offset(tmp_path, kappa):
    latin = tmp_path / "latin.jsonl"
    text = (tmp_path / "expansions.jsonl").read_bytes()
    latin.write_bytes(text.replace(b"kappa4 x", "kappa4 caf\u00e9".encode("latin-1")))
    offset = latin.read_bytes().index(b"\xe9")
    proc = _expand(tmp_path, kappa, latin)
    assert_one_clear_line(proc, "latin.jsonl: not UTF-8 text", f"byte 0xe9 at offset {offset}", "line 4")
    assert not _searched(proc)


def test_an_ear_trial_whose_expansions_file_is_not_utf8_is_refused_by_prepare(tmp_path, kappa, tiny_model_dir):
    (tmp_path / "latin.jsonl").write_bytes(b'{"query_id": "q1", "expansion": "caf\xe9"}\n')
    ear = {"kind": "ear", "name": "e", "data": {"collection": str(kappa), "validation_queries": 5},
           "expansion": {"source": "file", "path": "latin.jsonl", "n": 1}, "model": {"name": str(tiny_model_dir)}}
    (tmp_path / "e.yaml").write_text(yaml.safe_dump(ear))
    assert_one_clear_line(cli(tmp_path, "prepare", "e.yaml"), "latin.jsonl: not UTF-8 text", "byte 0xe9 at offset 36")


def test_an_expansion_that_is_null_names_the_file_and_line(tmp_path, kappa):
    path = tmp_path / "null.jsonl"
    path.write_text((tmp_path / "expansions.jsonl").read_text().replace('"kappa6 x"', "null"))
    proc = _expand(tmp_path, kappa, path)
    assert_one_clear_line(proc, "null.jsonl:6:", '"expansion" is null, not a string')
    assert not _searched(proc)


def test_expand_checks_the_ear_files_it_is_given_before_any_search(tmp_path, kappa):
    proc = _expand(tmp_path, kappa, tmp_path / "expansions.jsonl", "--ear", "no_such.yaml")
    assert_one_clear_line(proc, "--ear no_such.yaml: no such EAR trial file")
    assert "first_stage" not in proc.stderr and not _searched(proc)
    (tmp_path / "untrained.yaml").write_text(yaml.safe_dump({
        "kind": "ear", "name": "u", "data": {"collection": str(kappa)}, "model": {"name": "minilm-l6"}}))
    proc = _expand(tmp_path, kappa, tmp_path / "expansions.jsonl", "--ear", "untrained.yaml")
    assert_one_clear_line(proc, "--ear untrained.yaml: EAR trial u is not trained yet")
    assert not _searched(proc)


def test_expand_depth_is_capped_as_in_an_ear_trial(tmp_path, kappa):
    assert_one_clear_line(_expand(tmp_path, kappa, tmp_path / "expansions.jsonl", "--depth", "1001"),
                          "argument --depth: 1001 is out of range", "between 1 and 1000")


@pytest.mark.slow
def test_expand_reports_only_what_its_depth_measures_reads_past_a_byte_order_mark_and_names_no_seed_of_a_file(
        tmp_path, kappa, monkeypatch):
    monkeypatch.setenv("ORCHESTRATE_CACHE_DIR", str(tmp_path / "cache"))  # (its term-vector index stays its own)
    plain = _expand(tmp_path, kappa, tmp_path / "expansions.jsonl", "--depth", "20")
    assert plain.returncode == 0, plain.stderr[-3000:]
    header, columns = plain.stdout.splitlines()[:2]
    assert "1 file expansions each, BM25 top-20" in header and "seed" not in header
    assert columns.split() == ["nDCG@10", "S@5", "S@20"]  # no R@100 or S@100 of a top-20 run
    as_json = json.loads(_expand(tmp_path, kappa, tmp_path / "expansions.jsonl", "--depth", "20", "--json").stdout)
    assert set(as_json["systems"]["bm25"]["metrics"]) == {"ndcg_at_10", "success_at_5", "success_at_20"}

    bom = tmp_path / "bom.jsonl"  # what some editors write first: read past, the same expansions
    bom.write_bytes(b"\xef\xbb\xbf" + (tmp_path / "expansions.jsonl").read_bytes())
    marked = _expand(tmp_path, kappa, bom, "--depth", "20", "--json")
    assert marked.returncode == 0, marked.stderr[-3000:]
    assert json.loads(marked.stdout)["systems"] == as_json["systems"]


# ----------------------------------------------------------------------------- compute estimates


def _sweep(tmp_path: Path) -> Path:
    config = {"name": "s", "base": {"data": {"collection": SCIFACT}},
              "grid": {"models": ["minilm-l6"], "losses": [{"ranking": "pointwise"}], "augmentations": [{"method": "none"}],
                       "sizes": [100]},
              "search": {"trials_per_cell": 1}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(config))
    return tmp_path / "s.yaml"


PROFILE = {"model": "bert-base-uncased", "tokens": 512, "train_pairs_per_second": 100, "score_pairs_per_second": 300}


@pytest.mark.parametrize("change, message", [
    ({"train_pairs_per_second": 0}, "train_pairs_per_second: Input should be greater than 0"),
    ({"train_pairs_per_second": "fast"}, "train_pairs_per_second: Input should be a valid number"),
    ({"tokens": 0}, "tokens: Input should be greater than 0"),
    ({"score_pairs_per_second": -5}, "score_pairs_per_second: Input should be greater than 0"),
    ({"model": "no-such-model-anywhere"}, "model 'no-such-model-anywhere' is unknown here"),
])
def test_a_throughput_profile_that_cannot_mean_anything_is_one_line(tmp_path, change, message):
    (tmp_path / "t.yaml").write_text(yaml.safe_dump({"mine": {**PROFILE, **change}}))
    proc = cli(tmp_path, "sweep", str(_sweep(tmp_path)), "--dry-run", "--throughput", "t.yaml", "--device", "mine")
    assert_one_clear_line(proc, "t.yaml: profile 'mine'", message)


@pytest.mark.parametrize("price", ["-1", "nan", "inf"])
def test_a_price_per_hour_that_is_no_price_is_one_line(tmp_path, price):
    assert_one_clear_line(cli(tmp_path, "sweep", str(_sweep(tmp_path)), "--dry-run", f"--price-per-hour={price}"),
                          "argument --price-per-hour")


@pytest.mark.parametrize("option", [["--device", "a10g"], ["--throughput", "t.yaml"], ["--price-per-hour", "2"]])
def test_estimate_options_without_a_dry_run_are_refused_not_ignored(tmp_path, option):
    (tmp_path / "t.yaml").write_text(yaml.safe_dump({"mine": PROFILE}))
    # (a Ray address nothing answers at: where the options were ignored, the sweep stops there, not after training)
    proc = cli(tmp_path, "sweep", str(_sweep(tmp_path)), *option, "--address", f"127.0.0.1:{free_port()}", timeout=60)
    assert_one_clear_line(proc, option[0], "add --dry-run")
    assert not (tmp_path / ".orchestrate").exists()


# ----------------------------------------------------------------------------- trial files


def _trial(tmp_path: Path, name: str = "t", **changes) -> Path:
    config = {"name": name, "data": {"collection": SCIFACT, "validation_queries": 5}, "model": {"name": "minilm-l6"}}
    for key, value in changes.items():
        config[key] = {**config.get(key, {}), **value}
    (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(config))
    return tmp_path / f"{name}.yaml"


def test_accumulating_more_batches_than_an_epoch_has_is_refused_by_the_dry_run(tmp_path):
    trial = _trial(tmp_path, training_data={"size": 40}, optimization={"batch_size": 8, "gradient_accumulation": 1000000})
    # 40 pairs: 20 triples, 4 per batch of 8 pairs: 5 batches an epoch
    assert_one_clear_line(cli(tmp_path, "run", str(trial), "--dry-run"), "t.yaml: trial t: optimization.gradient_accumulation",
                          "at most 5 batch(es)", "no optimizer step would happen; give at most 5")
    fine = _trial(tmp_path, "fine", training_data={"size": 40}, optimization={"batch_size": 8, "gradient_accumulation": 5})
    proc = cli(tmp_path, "run", str(fine), "--dry-run")
    assert proc.returncode == 0 and "would stop before it computes: optimization" not in proc.stdout, proc.stderr[-2000:]


def test_an_unknown_prebuilt_index_is_refused_before_anything_runs(tmp_path):
    trial = _trial(tmp_path, first_stage={"index": "beir-v1.0.0-scifakt.flat"})
    for command in (("run", str(trial), "--dry-run"), ("prepare", str(trial))):
        assert_one_clear_line(cli(tmp_path, *command), "first_stage.index: 'beir-v1.0.0-scifakt.flat' is not a prebuilt index",
                              "close: beir-v1.0.0-scifact.flat")
    vectors = _trial(tmp_path, "v", first_stage={"index": "beir-v1.0.0-scifact.bge-base-en-v1.5.hnsw"})
    assert_one_clear_line(cli(tmp_path, "run", str(vectors), "--dry-run"), "is a hnsw index, which BM25 cannot search")
    assert not (tmp_path / ".orchestrate").exists()


def test_scoreddocs_of_a_local_collection_is_refused_by_the_dry_run(tmp_path, kappa):
    trial = _trial(tmp_path, data={"collection": str(kappa)}, first_stage={"method": "scoreddocs"})
    assert_one_clear_line(cli(tmp_path, "run", str(trial), "--dry-run"), "first_stage.method: scoreddocs reads the run",
                          "is a local collection, which ships none")


def test_an_ear_first_stage_over_other_data_is_refused_and_prepare_does_not_wait_for_it(tmp_path, kappa):
    other = _beir(tmp_path / "other", {"d1": "cats purr", "d2": "dogs bark"}, {"q1": "what purrs"}, {"q1": "d1"})
    (tmp_path / "ear.yaml").write_text(yaml.safe_dump({
        "kind": "ear", "name": "elsewhere", "data": {"collection": str(other)}, "model": {"name": "minilm-l6"}}))
    trial = _trial(tmp_path, data={"collection": str(kappa)}, first_stage={"method": "ear", "run": "ear.yaml"})
    for command in (("run", str(trial), "--dry-run"), ("prepare", str(trial))):
        proc = cli(tmp_path, *command)
        assert_one_clear_line(proc, "ear.yaml: the EAR trial ranks", f"not {kappa} train",
                              "serves trials on its own data")
        assert "waits" not in proc.stdout and not _searched(proc)


# ----------------------------------------------------------------------------- BM25 and RM3


def test_rm3_with_more_expansion_terms_than_a_query_may_have_is_one_line(tmp_path):
    assert_one_clear_line(cli(tmp_path, "bm25", "--dataset", SCIFACT, "--rm3", "--fb-terms", "2000", "--fb-docs", "50"),
                          "argument --fb-terms: 2000 is out of range", "between 1 and 1000")
    trial = _trial(tmp_path, first_stage={"method": "rm3", "fb_terms": 2000})
    assert_one_clear_line(cli(tmp_path, "run", str(trial), "--dry-run"), "first_stage.fb_terms", "less than or equal to 1000")


def _cached_runs() -> set[str]:
    runs = Path(os.environ["ORCHESTRATE_CACHE_DIR"]) / "runs"
    return {p.name for p in runs.iterdir()} if runs.is_dir() else set()


@pytest.mark.slow
def test_a_search_that_fails_its_queries_or_finds_nothing_is_an_error_and_never_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("ORCHESTRATE_CACHE_DIR", str(tmp_path / "cache"))  # (its term-vector index stays its own)
    # 40 query terms in one long document whose 1,100 other terms are more frequent: RM3's 1,000
    # expansion terms and the query's own are more clauses than Lucene takes (1,024)
    asked, other = [f"q{i}y" for i in range(40)], [f"w{i}x" for i in range(1100)]
    wide = _beir(tmp_path / "wide", {"d1": " ".join(asked + other + other), **{f"o{i}": f"filler{i} text" for i in range(20)}},
                 {"q1": " ".join(asked), "q2": "filler3"}, {"q1": "d1", "q2": "o3"})
    before = _cached_runs()
    assert_one_clear_line(cli(tmp_path, "bm25", "--dataset", str(wide), "--rm3", "--fb-terms", "1000"),
                          "Anserini search: 1 queries failed", "TooManyClauses", "lower fb_terms", "nothing was cached")
    nothing = _beir(tmp_path / "nothing", {"d1": "cats purr", "d2": "dogs bark"}, {"q1": "zebras"}, {"q1": "d1"})
    assert_one_clear_line(cli(tmp_path, "bm25", "--dataset", str(nothing)), "Anserini search: it wrote an empty run")
    assert _cached_runs() == before
    proc = cli(tmp_path, "bm25", "--dataset", str(wide), "--rm3", "--fb-terms", "10", "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["metrics"]["ndcg_at_10"] == 1.0, proc.stderr[-2000:]


# ----------------------------------------------------------------------------- races


def _build_in_child(root: str, cache: str, barrier, built: str) -> None:
    """One process of two: both ask for the same index at the same moment; each Anserini
    indexing it starts is counted in ``built``."""
    os.environ["ORCHESTRATE_CACHE_DIR"] = cache

    real = bm25._run_java

    def counted(main_class, *args, **kwargs):
        if main_class.endswith("IndexCollection"):
            with open(built, "a") as out:
                out.write("built\n")
        return real(main_class, *args, **kwargs)

    bm25._run_java = counted
    collection = resolve_collection(root)
    collection.require_corpus()  # (its docstore first: the race under test is the index's)
    barrier.wait()
    index = bm25.build_index(collection, threads=1, docvectors=True)
    assert (index / "segments.complete").exists() and (index / "lucene").is_dir()


@pytest.mark.slow
def test_two_processes_build_the_term_vector_index_once_and_both_search_it(tmp_path, kappa):
    context = multiprocessing.get_context("spawn")  # (no fork of a process that holds Arrow's and torch's threads)
    barrier, built = context.Barrier(2), tmp_path / "built.txt"
    cache = str(tmp_path / "cache")
    processes = [context.Process(target=_build_in_child, args=(str(kappa), cache, barrier, str(built))) for _ in range(2)]
    for p in processes:
        p.start()
    for p in processes:
        p.join(timeout=300)
    assert [p.exitcode for p in processes] == [0, 0]
    assert built.read_text().splitlines() == ["built"]  # the second waited for the first's index, then read it

    # the commands, two at once on a fresh cache: both search the one index RM3 needs
    env = {**os.environ, "ORCHESTRATE_CACHE_DIR": str(tmp_path / "fresh")}
    commands = [subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "bm25", "--dataset", str(kappa), "--rm3", "--json"],
                                 cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for _ in range(2)]
    outputs = [c.communicate(timeout=300) for c in commands]
    assert [c.returncode for c in commands] == [0, 0], [err[-2000:] for _, err in outputs]
    assert sum(err.count("] indexing ") for _, err in outputs) == 1
    assert json.loads(outputs[0][0])["metrics"] == json.loads(outputs[1][0])["metrics"]
