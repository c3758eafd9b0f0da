"""The dense trial kind: its spec (one-line errors), its registration, a tiny trial end to end."""

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from tests.helpers import assert_validates_query_by_query
from workloads.core.errors import InputError
from workloads.kinds.dense.spec import SEARCHED_PARAMETERS, DenseSpec, DenseTrialSpec, dense_key, load_dense_trial

SHIPPED = Path(__file__).resolve().parents[4] / "search_spaces" / "trials" / "dense-trial-scifact.yaml"  # the guide's
BASE = {"kind": "dense", "name": "d", "data": {"collection": "beir/scifact"}, "model": {"name": "minilm-l6"}}


def _file(tmp_path, data) -> str:
    path = tmp_path / "dense.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


@pytest.mark.parametrize(("change", "message"), [
    ({"dense": {"rtd_lambda": 0.1}}, "dense: rtd_lambda: read by objective diffcse only (objective is contrastive)"),
    ({"dense": {"objective": "diffcse", "masking_ratio": 1.5}}, "dense.masking_ratio: Input should be less than 1"),
    ({"dense": {"unsupervised": True, "negatives": "bm25"}}, "dense: unsupervised training has no queries"),
    ({"dense": {"temperature": 0}}, "dense.temperature: Input should be greater than 0"),
    ({"model": {"name": "minilm-l6", "towers": "three"}}, "model.towers: Input should be 'shared' or 'separate'"),
    ({"dense": {"lr": 1e-5}}, "dense.lr: Extra inputs are not permitted"),
])
def test_bad_input_is_one_line_naming_the_file_and_field(tmp_path, change, message):
    path = _file(tmp_path, {**BASE, **change})
    with pytest.raises(InputError) as caught:
        load_dense_trial(path)
    assert str(caught.value).startswith(f"{path}: {message}")
    assert "\n" not in str(caught.value)


def test_not_a_dense_file_and_a_missing_one_are_one_line(tmp_path):
    with pytest.raises(InputError, match="not a dense trial file"):
        load_dense_trial(_file(tmp_path, {**BASE, "kind": "ear"}))
    with pytest.raises(InputError, match="no such dense trial file"):
        load_dense_trial(str(tmp_path / "absent.yaml"))


def test_the_key_ignores_name_and_resources_and_follows_what_trains():
    spec = DenseTrialSpec.model_validate(BASE)
    assert dense_key(spec) == dense_key(spec.model_copy(update={"name": "other"}))
    for changed in ({"dense": {"temperature": 0.1}}, {"dense": {"objective": "diffcse"}}, {"seed": 1}):
        assert dense_key(DenseTrialSpec.model_validate({**BASE, **changed})) != dense_key(spec)


def test_the_shipped_dense_trial_dry_runs_as_the_guide_describes(tmp_path):
    from tests.helpers import run_cli

    spec = load_dense_trial(str(SHIPPED))
    proc = run_cli(tmp_path, "run", str(SHIPPED), "--dry-run")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.splitlines()[0].startswith(f"dense trial dense-trial-scifact (identity {dense_key(spec)}): kept in ")
    assert (spec.dense.objective, spec.dense.rtd_lambda, spec.dense.pooler) == ("diffcse", 0.005, "batchnorm_joint")
    assert "    pooler: batchnorm_joint" in proc.stdout.splitlines() and "    rtd_average: padded" in proc.stdout.splitlines()
    assert not (tmp_path / ".orchestrate").exists()  # a dry run writes nothing


def test_the_searched_parameters_are_the_specs_fields():
    fields = DenseSpec.model_fields
    for parameter in SEARCHED_PARAMETERS:
        assert parameter.searchable and fields[parameter.field].default == parameter.default
    assert {p.field for p in SEARCHED_PARAMETERS} == {"learning_rate", "temperature", "rtd_lambda", "masking_ratio"}


def test_the_grid_gives_each_cell_its_objective_and_searches_rtd_only_where_it_trains():
    from types import SimpleNamespace

    from workloads.kinds.dense.grid import DenseGridSpec, check_base, expand_grid
    from workloads.kinds.dense.kind import KIND

    base = {"kind": "dense", "data": {"collection": "beir/scifact"},
            "dense": {"generator": "distilbert-base-uncased", "rtd_lambda": 0.01, "epochs": 2}}
    grid = DenseGridSpec(models=["minilm-l6"], objectives=["contrastive", "diffcse"], negatives=["bm25", "in_batch"])
    sweep = SimpleNamespace(name="g", base=base, grid=grid)
    check_base(sweep)
    cells = expand_grid(sweep)
    assert sorted((c.axes["loss"], c.axes["augmentation"]) for c in cells) == [
        ("diffcse-dpr", "bm25-negatives"), ("diffcse-dpr", "in_batch-negatives"),
        ("dpr", "bm25-negatives"), ("dpr", "in_batch-negatives")]
    assert len({c.key for c in cells}) == 4
    for cell in cells:
        dense = cell.spec.dense
        assert dense.epochs == 2
        if dense.objective == "diffcse":  # base's RTD settings are the diffcse cells'
            assert (dense.generator, dense.rtd_lambda) == ("distilbert-base-uncased", 0.01)
            assert KIND.searched_names(cell.spec) == ("learning_rate", "temperature", "rtd_lambda", "masking_ratio")
        else:
            assert KIND.searched_names(cell.spec) == ("learning_rate", "temperature")
        sampled = KIND.apply_params(cell.spec, {name: 0.2 for name in KIND.searched_names(cell.spec)})
        assert sampled.dense.temperature == 0.2 and sampled.dense.objective == dense.objective
    with pytest.raises(ValueError, match="base.dense.objective is set by the grid"):
        check_base(SimpleNamespace(name="g", base={**base, "dense": {"objective": "diffcse"}}, grid=grid))


def test_the_estimate_counts_training_rows_validation_candidates_and_the_test_corpus():
    from workloads.kinds.dense.kind import KIND

    spec = DenseTrialSpec.model_validate({**BASE, "training_data": {"size": 1000}, "first_stage": {"validation_depth": 20},
                                          "model": {"name": "minilm-l6", "max_length": 128, "query_max_length": 32}})
    queries = {"train": 809, "test": 300}
    train, validation, test = KIND.cell_pairs(spec, None, lambda collection, split: queries[split])
    assert train == int(500 * (0.25 + 1 + 1))  # 500 rows: a query (a quarter of max_length), a positive, a negative
    assert validation == 50 * 20 and test == 5_183 + 75
    diffcse = spec.model_copy(update={"dense": spec.dense.model_copy(update={"objective": "diffcse"})})
    assert KIND.cell_pairs(diffcse, None, lambda collection, split: queries[split])[0] == 2 * train
    unknown = spec.model_copy(update={"data": spec.data.model_copy(update={"collection": "elsewhere"})})
    assert KIND.cell_pairs(unknown, None, lambda collection, split: queries[split])[2] is None


def test_the_kind_is_registered():
    from workloads.kinds import TRIAL_KINDS, kind_of

    assert kind_of(DenseTrialSpec.model_validate(BASE)) is TRIAL_KINDS["dense"]


@pytest.fixture(scope="module")
def small_scifact(tmp_path_factory, scifact_dir):
    """A small BEIR collection cut from SciFact: 40 train and 20 test queries, their judged
    documents and 200 others (the whole corpus is encoded at test: 5,183 documents take a minute)."""
    import gzip

    path = tmp_path_factory.mktemp("small-scifact")
    (path / "qrels").mkdir()
    judged: set[str] = set()
    for split, count in (("train", 40), ("test", 20)):
        lines = (scifact_dir / "qrels" / f"{split}.tsv").read_text().splitlines()
        kept = sorted({line.split()[0] for line in lines[1:]})[:count]
        rows = [line for line in lines[1:] if line.split()[0] in kept]
        judged |= {line.split()[1] for line in rows}
        (path / "qrels" / f"{split}.tsv").write_text("\n".join([lines[0], *rows]) + "\n")
    with gzip.open(scifact_dir / "corpus.jsonl.gz", "rt") as corpus:
        documents = [line for line in corpus if json.loads(line)["_id"] in judged]
    with gzip.open(scifact_dir / "corpus.jsonl.gz", "rt") as corpus:
        others = [line for _, line in zip(range(200), corpus) if json.loads(line)["_id"] not in judged]
    (path / "corpus.jsonl").write_text("".join(documents + others))
    (path / "queries.jsonl").symlink_to(scifact_dir / "queries.jsonl")
    return path


def test_unsupervised_rows_are_corpus_sentences_each_its_own_positive(small_scifact):
    from workloads.kinds.dense.steps import corpus_sentences
    from workloads.kinds.dense.train import DenseInputs, training_rows

    spec = DenseTrialSpec.model_validate({**BASE, "data": {"collection": str(small_scifact)},
                                          "training_data": {"size": 30, "seed": 5},
                                          "dense": {"unsupervised": True, "sentences_per_document": 2}})
    assert not spec.dense.hard_negatives  # no queries, no BM25 negatives
    path, count = corpus_sentences(spec)
    assert count == 30 and corpus_sentences(spec) == (path, 30)  # cached by content
    rows = training_rows(DenseInputs(path, True, "", {}, 1))
    assert len(rows) == 30 and all(r["anchor"] == r["positive"] and not r["negatives"] for r in rows)
    assert all(len(r["anchor"]) >= 20 for r in rows)
    per_document = pq.read_table(path).column("doc_id").to_pylist()
    assert max(per_document.count(d) for d in per_document) <= 2
    other_seed = spec.model_copy(update={"training_data": spec.training_data.model_copy(update={"seed": 6})})
    assert corpus_sentences(other_seed)[0] != path


@pytest.mark.slow  # BM25 indexes and runs (Java), two epochs and a corpus encoded: over 10 s
@pytest.mark.parametrize("objective", ["contrastive", "diffcse"])
def test_a_tiny_dense_trial_in_process(tmp_path, tiny_model_dir, small_scifact, objective):
    """prepare, train two epochs, choose on validation, test by exact search over the corpus, keep."""
    from workloads.kinds import run_in_process
    from workloads.kinds.dense.encoder import BiEncoder
    from workloads.kinds.dense.spec import MODEL_DIR, trained_dense

    dense = {"objective": objective, "epochs": 2, "batch_size": 4, "learning_rate": 1e-3, "eval_batch_size": 256,
             **({"rtd_lambda": 0.5} if objective == "diffcse" else {})}
    if objective == "diffcse":  # the shipped trial file's settings (pooler, generator, averaging), at the tiny size
        dense = {**load_dense_trial(str(SHIPPED)).dense.model_dump(), **dense}
        assert dense["pooler"] == "batchnorm_joint" and dense["generator"] == "frequency"
    spec = DenseTrialSpec.model_validate({
        "kind": "dense", "name": f"tiny-{objective}", "data": {"collection": str(small_scifact), "validation_queries": 5},
        "first_stage": {"train_depth": 10, "validation_depth": 10}, "training_data": {"size": 16, "seed": 3},
        "model": {"name": str(tiny_model_dir), "max_length": 32, "query_max_length": 16}, "dense": dense,
        "precision": "fp32"})
    prepared, records, tested = run_in_process(spec, tmp_path / "checkpoints")
    assert [r.metrics["epoch"] for r in records] == [1, 2]
    assert all("val_ndcg_at_10" in r.metrics and r.metrics["train_contrastive"] > 0 for r in records)
    assert_validates_query_by_query(records[-1].metrics, queries=5)
    assert ("train_rtd" in records[0].metrics) == (objective == "diffcse")
    assert tested.evaluation.num_queries == 20 and 0 <= tested.evaluation.aggregate["recall_at_100"] <= 1
    corpus = sum(1 for _ in (small_scifact / "corpus.jsonl").open())
    assert all(len(ranking) == corpus for ranking in tested.run.values())  # exact search over the whole corpus
    kept = trained_dense(spec)
    assert kept is not None and json.loads((kept / "dense_result.json").read_text())["key"] == dense_key(spec)
    encoder = BiEncoder.from_pretrained(str(kept / MODEL_DIR))
    assert encoder.normalize and not any(name.startswith("pooler") for name in encoder.state_dict())
