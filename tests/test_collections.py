"""Collections from BEIR directories, TREC files and references; bad inputs give clear errors."""

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from workloads.collections import load_beir_directory, resolve_collection
from workloads.errors import InputError

REPO = Path(__file__).resolve().parents[1]


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
def test_bad_inputs_name_file_line_and_problem(tmp_path, case, expected):
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
        load_beir_directory(root)


def test_unknown_dataset_is_a_clear_error():
    with pytest.raises(InputError, match="no-such-collection-xyz: unknown dataset"):
        resolve_collection("no-such-collection-xyz")


def test_unknown_split_names_known_ones(scifact_dir):
    with pytest.raises(InputError, match=r"no split 'dev' \(splits: test, train\)"):
        resolve_collection(str(scifact_dir)).split_qrels("dev")


def run_cli(*args, env_extra=None):
    import os

    env = dict(os.environ, **(env_extra or {}))
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], capture_output=True, text=True, env=env, cwd=REPO)


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
