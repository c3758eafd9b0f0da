"""The dense kind's messages read exactly (issue 59): the STS reader's, the dense search's log."""

import pytest

from tests.workloads.kinds.dense.test_dense_retrieval import corpus, dense_stage
from workloads.core.errors import InputError
from workloads.kinds.dense.first_stage import dense
from workloads.kinds.dense.sts import read_sts


def test_an_sts_error_names_the_physical_line_after_blank_lines(tmp_path):
    (tmp_path / "sts.tsv").write_text("4.5\ta\tb\n1.0\tc\td\n\nhigh\te\tf\n")
    with pytest.raises(InputError) as raised:
        read_sts(tmp_path / "sts.tsv")
    assert str(raised.value) == f"{tmp_path / 'sts.tsv'}:4: score 'high' is not a number"


def test_an_sts_header_counts_as_a_line_after_a_blank_first_line(tmp_path):
    (tmp_path / "sts.tsv").write_text("\nsentence1\tsentence2\tscore\na\tb\t1.0\nonly one\n")
    with pytest.raises(InputError) as raised:
        read_sts(tmp_path / "sts.tsv")
    assert str(raised.value) == f"{tmp_path / 'sts.tsv'}:4: 1 columns, the header names 3"


def test_an_sts_path_that_is_a_directory_says_so(tmp_path):
    with pytest.raises(InputError) as raised:
        read_sts(tmp_path)
    assert str(raised.value) == f"{tmp_path}: a directory, not an STS file (name the file of sentence pairs in it)"
    with pytest.raises(InputError) as raised:
        read_sts(tmp_path / "absent.tsv")
    assert str(raised.value) == f"{tmp_path / 'absent.tsv'}: no such STS file"


def test_the_dense_log_says_what_was_found_not_the_depth_asked(tiny_model_dir, tmp_path, monkeypatch, project_log):
    monkeypatch.setenv("ORCHESTRATE_CACHE_DIR", str(tmp_path / "cache"))
    collection = corpus(12)
    dense(collection, "test", collection.split_queries("test"), 1000, dense_stage(model=str(tiny_model_dir)))
    lines = {r.getMessage() for r in project_log.records if r.getMessage().startswith("dense (")}
    assert lines == {"dense (flat) retrieved 12 of 12 documents per query (1,000 asked) for 3 queries"}
