"""Collections from BEIR directories, TREC files and references; bad inputs give clear errors."""

import gzip
import json
import os
import pickle
from pathlib import Path

import pytest
import yaml

import workloads.kinds.rerank.steps as trial
from tests.helpers import held_out_scifact
from tests.helpers import run_cli as run_in_process
from workloads.core.errors import InputError
from workloads.data.collections import Collection
from workloads.data.document import Document
from workloads.data.identity import corpus_fingerprint
from workloads.data.local_files import load_beir_directory
from workloads.data.resolve import resolve_collection
from workloads.kinds.rerank.spec import TrialSpec

REPO = Path(__file__).resolve().parents[3]


def write_beir(root: Path, corpus_lines=None, qrels_text="query-id\tcorpus-id\tscore\r\nq1\td1\t1\r\nq1\td2\t2\r\n", gz=False):
    root.mkdir(parents=True, exist_ok=True)
    corpus_lines = corpus_lines if corpus_lines is not None else [
        {"_id": "d1", "title": "Cats", "text": "Cats purr."}, {"_id": "d2", "title": "", "text": "Dogs bark."}]
    body = "".join(json.dumps(line) + "\n" for line in corpus_lines)
    if gz:
        with gzip.open(root / "corpus.jsonl.gz", "wt") as out:
            out.write(body)
    else:
        (root / "corpus.jsonl").write_text(body)
    (root / "queries.jsonl").write_text(json.dumps({"_id": "q1", "text": "what purrs"}) + "\n")
    (root / "qrels").mkdir(exist_ok=True)
    (root / "qrels" / "test.tsv").write_bytes(qrels_text.encode())
    return root


def test_beir_directory_with_header_crlf_and_gzip(tmp_path):
    collection = load_beir_directory(write_beir(tmp_path / "c", gz=True))
    assert collection.splits == ["test"]
    assert collection.split_qrels("test") == {"q1": {"d1": 1, "d2": 2}}
    assert collection.document("d1").contents == "Cats Cats purr." and collection.document("d2").contents == "Dogs bark."


def test_beir_qrels_without_header(tmp_path):
    collection = load_beir_directory(write_beir(tmp_path / "c", qrels_text="q1\td1\t1\n"))
    assert collection.split_qrels("test") == {"q1": {"d1": 1}}


def test_real_scifact(scifact_dir):
    collection = resolve_collection("beir/scifact")
    assert len(collection.corpus) == 5183
    assert len(collection.split_queries("test")) == 300 and len(collection.split_queries("train")) == 809
    assert sum(len(d) for d in collection.split_qrels("test").values()) == 339


def test_trec_dl_2019_topics_and_qrels():
    collection = resolve_collection("trec-dl-2019-doc")
    assert len(collection.split_queries("test")) == 43
    assert collection.relevance_level == 2  # TREC-DL's binary cut-off
    assert collection.corpus is None
    with pytest.raises(InputError, match="has no corpus"):
        collection.require_corpus()


@pytest.mark.parametrize(
    "case, expected",
    [
        ("qrels_columns", r"qrels/test.tsv:2: expected 3 columns .* got 2"),
        ("qrels_grade", r"qrels/test.tsv:2: relevance 'high' is not an integer"),
        ("missing_field", r"corpus.jsonl:2: missing field\(s\) '_id'"),
        ("empty_corpus", r"corpus.jsonl: empty corpus: no documents"),
        ("bad_json", r"corpus.jsonl:1: not valid JSON"),
    ],
)
def test_bad_inputs_name_file_line_and_problem(tmp_path, case, expected, shared_cache):
    kwargs = {
        "qrels_columns": {"qrels_text": "q1\td1\t1\nq1 d2\n"},
        "qrels_grade": {"qrels_text": "q1\td1\t1\nq1\td2\thigh\n"},
        "missing_field": {"corpus_lines": [{"_id": "d1", "text": "x"}, {"text": "no id"}]},
        "empty_corpus": {"corpus_lines": []},
    }.get(case, {})
    root = write_beir(tmp_path / "c", **kwargs)
    if case == "bad_json":
        (root / "corpus.jsonl").write_text("{not json\n")
    with pytest.raises(InputError, match=expected):
        len(load_beir_directory(root).corpus)  # the corpus is read when first used: its store is built then
    stores = shared_cache / "docstores"
    assert not stores.is_dir() or not any(p.name.startswith(".") for p in stores.iterdir())  # nothing half-written


def test_unknown_dataset_is_a_clear_error():
    with pytest.raises(InputError, match="no-such-collection-xyz: unknown dataset"):
        resolve_collection("no-such-collection-xyz")


def test_unknown_split_names_known_ones(scifact_dir):
    with pytest.raises(InputError, match=r"no split 'dev' \(splits: test, train\)"):
        resolve_collection(str(scifact_dir)).split_qrels("dev")


def run_cli(*args, env_extra=None):


    return run_in_process(REPO, *args, env=env_extra)


def test_cli_bad_input_is_one_line_exit_2(tmp_path):
    root = write_beir(tmp_path / "broken", qrels_text="q1 d1\n")
    proc = run_cli("bm25", "--dataset", str(root), "--split", "test")
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0
    assert proc.stderr.startswith("error: ") and "qrels/test.tsv:1: expected 3 columns" in proc.stderr
    assert proc.stdout == ""


def test_cli_unknown_dataset_exit_2():
    proc = run_cli("bm25", "--dataset", "beir/not-a-dataset-xyz", "--split", "test")
    assert proc.returncode == 2 and "beir/not-a-dataset-xyz" in proc.stderr and proc.stderr.count("\n") == 1


def trec_dir(root: Path, name: str, collection_yaml: str | None = None) -> Path:
    path = root / name
    path.mkdir(parents=True)
    (path / "topics.tsv").write_text("q1\twhat purrs\nq2\twhy bark\n")
    (path / "qrels.txt").write_text("q1 0 d1 2\nq1 0 d2 1\nq2 0 d2 3\n")
    if collection_yaml is not None:
        (path / "collection.yaml").write_text(collection_yaml)
    return path


def test_collection_yaml_states_relevance_level_and_corpus(tmp_path):
    assert resolve_collection(str(trec_dir(tmp_path, "judged-dl"))).relevance_level == 2  # the documented guess
    assert resolve_collection(str(trec_dir(tmp_path, "plain"))).relevance_level == 1
    corpus = write_beir(tmp_path / "corpus-beir")
    stated = resolve_collection(str(trec_dir(tmp_path, "stated-dl", f"relevance_level: 3\ncorpus: {corpus}\n")))
    assert stated.relevance_level == 3  # the file, not the name, decides
    assert stated.document("d1").contents == "Cats Cats purr."  # a topics-and-qrels directory given a corpus to re-rank
    relative = resolve_collection(str(trec_dir(tmp_path, "relative", "corpus: ../corpus-beir\n")))
    assert relative.document("d2").text == "Dogs bark."


@pytest.mark.parametrize(
    "text, expected",
    [
        ("relevance_level: two\n", r"collection.yaml: relevance_level must be an integer >= 1, got 'two'"),
        ("relevance_level: 0\n", r"collection.yaml: relevance_level must be an integer >= 1"),
        ("relevance: 2\n", r"collection.yaml: relevance: unknown key \(known: corpus, relevance_level\)"),
        ("[1, 2]\n", r"collection.yaml: expected a mapping"),
        ("relevance_level: [\n", r"collection.yaml: cannot read"),
    ],
)
def test_bad_collection_yaml_is_one_clear_error(tmp_path, text, expected):
    with pytest.raises(InputError, match=expected):
        resolve_collection(str(trec_dir(tmp_path, "bad", text)))


def test_overlapping_splits_of_one_collection_are_refused_before_anything_is_computed(tmp_path, monkeypatch):
    root = write_beir(tmp_path / "overlap")
    (root / "queries.jsonl").write_text("".join(json.dumps({"_id": q, "text": f"query {q}"}) + "\n" for q in ("q1", "q2", "q3")))
    (root / "qrels" / "train.tsv").write_text("q1\td1\t1\nq2\td2\t1\n")  # q1 is judged in train and in test
    (root / "qrels" / "dev.tsv").write_text("q3\td1\t1\n")
    monkeypatch.setattr(trial, "first_stage_run", lambda *a, **k: pytest.fail("computed something before the guard"))
    spec = TrialSpec.model_validate({"name": "t", "data": {"collection": str(root), "validation_split": "dev"},
                                     "model": {"name": "minilm-l6"}})
    with pytest.raises(InputError, match=r"overlap: train and test queries overlap: 1 shared \(e.g. 'q1'\)"):
        trial.prepare_trial(spec)
    (root / "qrels" / "dev.tsv").write_text("q2\td1\t1\n")
    with pytest.raises(InputError, match=r"train and validation queries overlap: 1 shared \(e.g. 'q2'\)"):
        trial.prepare_trial(spec)


@pytest.mark.parametrize("case", ["split", "collection_yaml", "overlap"])
def test_cli_guards_are_one_line_exit_2(tmp_path, case):
    root = write_beir(tmp_path / "c")
    data = {"collection": str(root)}
    if case == "split":
        data["validation_split"] = "test"
    elif case == "collection_yaml":
        (root / "collection.yaml").write_text("relevance_level: -1\n")
    else:
        (root / "qrels" / "train.tsv").write_text("q1\td1\t1\n")
        data["validation_split"] = "test2"
        (root / "qrels" / "test2.tsv").write_text("q1\td1\t1\n")
    config = tmp_path / "trial.yaml"
    config.write_text(yaml.safe_dump({"name": "t", "data": data, "model": {"name": "minilm-l6"}}))
    proc = run_cli("run", str(config), "--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}", "--storage", str(tmp_path / "s"))
    expected = {"split": "validation_split and test_split are both 'test'", "collection_yaml": "relevance_level must be",
                "overlap": "queries overlap"}[case]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert proc.returncode == 2 and len(errors) == 1 and expected in errors[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_a_collection_is_opened_once_per_process_and_again_when_its_files_change(tmp_path):
    root = write_beir(tmp_path / "c")
    first = resolve_collection(str(root))
    assert resolve_collection(str(root)) is first  # a trial, its targets, the cells: one read
    fingerprint = first.fingerprint
    corpus = root / "corpus.jsonl"
    corpus.write_text(corpus.read_text().replace("Dogs bark", "Wolves howl"))
    os.utime(corpus, ns=(corpus.stat().st_atime_ns, corpus.stat().st_mtime_ns + 1_000_000))
    changed = resolve_collection(str(root))
    assert changed is not first and changed.fingerprint != fingerprint


def test_the_corpus_fingerprint_follows_the_corpus_not_the_queries(tmp_path, scifact_dir):
    """A held-out copy with the same corpus (linked) shares its indexes and runs; an in-memory
    collection still hashes its documents."""
    original = resolve_collection(str(scifact_dir))
    held_out = resolve_collection(str(held_out_scifact(tmp_path, scifact_dir)))
    assert held_out.fingerprint == original.fingerprint and len(held_out.qrels["test"]) < len(original.qrels["test"])
    in_memory = Collection("m", {"d": Document("d", "", "text")}, {}, {})
    assert len(in_memory.fingerprint) == 16 and in_memory.fingerprint != original.fingerprint
    # ir_datasets: collections over one corpus share it (one index for msmarco-document and its TREC-DL subsets)
    assert (corpus_fingerprint(None, "msmarco-document")
            == corpus_fingerprint(None, "msmarco-document/trec-dl-2019/judged")
            != corpus_fingerprint(None, "beir/scifact"))

    assert pickle.loads(pickle.dumps(held_out)).fingerprint == original.fingerprint  # a collection travels to tasks
