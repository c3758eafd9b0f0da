"""Mined hard negatives, MarginMSE distillation, STS evaluation, first-stage comparisons."""

import random

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from scipy import stats

from workloads.core.errors import InputError
from workloads.data.collections import Collection
from workloads.data.document import Document
from workloads.kinds.dense.mining import MiningOptions, choose_negatives, negative_pool
from workloads.kinds.rerank.batching import lists_to_batch, triples_to_batch
from workloads.losses import RANKING_LOSSES, ModelOutputs, build_ranking_loss

CANDIDATES = {"p": 0.9, "a": 0.95, "b": 0.8, "c": 0.7, "d": 0.4, "e": 0.1}


# ----------------------------------------------------------------------------- mining
def test_negative_pool_drops_positives_cuts_depth_and_skips_the_top():
    pool = negative_pool(CANDIDATES, {"p": 0.9}, {"p"}, MiningOptions(depth=4))
    assert pool == [("a", 0.95), ("b", 0.8), ("c", 0.7), ("d", 0.4)]
    assert [d for d, _ in negative_pool(CANDIDATES, {"p": 0.9}, {"p"}, MiningOptions(depth=4, skip_top=2))] == ["c", "d"]


def test_margin_filters_compare_with_the_hardest_positive():
    positives = {"p": 0.9, "p2": 0.75}  # the hardest positive scores 0.75
    absolute = negative_pool(CANDIDATES, positives, {"p", "p2"}, MiningOptions(absolute_margin=0.1))
    assert [d for d, _ in absolute] == ["d", "e"]  # c: 0.7 + 0.1 > 0.75
    relative = negative_pool(CANDIDATES, positives, {"p", "p2"}, MiningOptions(relative_margin=0.5))
    assert [d for d, _ in relative] == ["e"]  # <= 0.75 - 0.375
    skipped = negative_pool(CANDIDATES, positives, {"p", "p2"}, MiningOptions(absolute_margin=0.0, skip_top=1))
    assert [d for d, _ in skipped] == ["d", "e"]  # the filter first (a, b gone), then skip c


def test_the_relative_margin_stays_below_a_negative_positive_score():
    # a cross-encoder's logits: the hardest positive scores -2.0; relative margin 0.1 keeps what scores <= -2.2
    candidates = {"above": -1.9, "level": -2.0, "close": -2.1, "far": -2.3, "p": -2.0}
    pool = negative_pool(candidates, {"p": -2.0}, {"p"}, MiningOptions(relative_margin=0.1))
    assert pool == [("far", -2.3)]
    # sentence-transformers' s > p (1 - r) would keep all four (threshold -1.8, above the positive)


def test_choose_negatives_takes_the_top_or_draws_with_the_seed():
    pool = [("a", 3.0), ("b", 2.0), ("c", 1.0)]
    assert choose_negatives(pool, 2, "top", random.Random(0)) == [("a", 3.0), ("b", 2.0)]
    assert choose_negatives(pool, 1, "random", random.Random(5)) == [random.Random(5).choice(pool)]
    assert sorted(choose_negatives(pool, 5, "random", random.Random(0))) == sorted(pool)
    with pytest.raises(ValueError, match="sampling"):
        MiningOptions(sampling="best")


class TableMiner:
    """A miner whose scores are given: each query's candidates d0..d9 scored 10 - rank."""

    key = "table"
    options = MiningOptions(depth=5, skip_top=1)

    def __init__(self):
        self.calls = 0

    def score(self, queries, rankings, positives):
        self.calls += 1
        return {q: ({f"d{i}": 10.0 - i for i in range(10)}, {p: 20.0 for p in positives[q]}) for q in queries}


def test_mined_training_set_keeps_the_positives_and_the_miners_scores(tmp_path, monkeypatch):
    from workloads.kinds.rerank.training_sets import build_training_set
    from workloads.retrieval.bm25 import write_trec_run
    from workloads.retrieval.first_stage import FirstStageRun

    monkeypatch.setenv("ORCHESTRATE_CACHE_DIR", str(tmp_path / "cache"))
    docs = {f"d{i}": Document(f"d{i}", "", f"document {i}") for i in range(10)}
    qrels = {"train": {f"q{j}": {"d9": 1} for j in range(4)}}
    collection = Collection("toy-mining", docs, {f"q{j}": f"query {j}" for j in range(4)}, qrels)
    run_path = tmp_path / "bm25.trec"
    write_trec_run({f"q{j}": {f"d{i}": float(i) for i in range(10)} for j in range(4)}, run_path, "bm25")
    plain, _ = build_training_set(collection, "train", list(qrels["train"]), FirstStageRun(run_path), 10, 4, 3)
    miner = TableMiner()
    mined, stats_ = build_training_set(collection, "train", list(qrels["train"]), FirstStageRun(run_path), 10, 4, 3,
                                       miner=miner)
    assert mined != plain and miner.calls == 1
    rows = pq.read_table(mined).to_pylist()
    assert {r["positive_id"] for r in rows} == {"d9"} == {r["positive_id"] for r in pq.read_table(plain).to_pylist()}
    # candidates d0..d8 (d9 is the positive) by score, top 5, the first skipped: d1..d4
    assert {r["negative_id"] for r in rows} <= {"d1", "d2", "d3", "d4"}
    assert all(r["positive_score"] == 20.0 and r["negative_score"] == 10.0 - int(r["negative_id"][1:]) for r in rows)
    assert "positive_score" not in pq.read_schema(plain).names  # an un-mined set is as before
    again, _ = build_training_set(collection, "train", list(qrels["train"]), FirstStageRun(run_path), 10, 4, 3, miner=miner)
    assert again == mined and miner.calls == 1  # found by its key


def test_dense_miner_scores_candidates_and_positives_with_one_encoder(tmp_path, monkeypatch, tiny_model_dir):
    from workloads.kinds.dense.encoder import BiEncoder, declared_normalization
    from workloads.kinds.dense.mining import DenseMiner

    monkeypatch.setenv("ORCHESTRATE_CACHE_DIR", str(tmp_path / "cache"))
    docs = {f"d{i}": Document(f"d{i}", "", f"document number {i} on subject {i % 3}") for i in range(12)}
    collection = Collection("toy-miner", docs, {"q0": "subject 1"}, {"train": {"q0": {"d4": 1}}})
    miner = DenseMiner(collection, str(tiny_model_dir), "tiny", MiningOptions(depth=5))
    # a plain BERT checkpoint declares no normalisation: mined by cosine (as sentence-transformers), keyed apart
    assert not declared_normalization(str(tiny_model_dir)) and miner.key == "dense-tiny-mined-l2"
    candidates, positives = miner.score({"q0": "subject 1"}, {}, {"q0": ["d4"]})["q0"]
    model = BiEncoder.from_pretrained(str(tiny_model_dir), normalize=True)
    query = model.encode_queries(["subject 1"])[0]
    products = {d: float(model.encode_documents([doc.contents])[0] @ query) for d, doc in docs.items()}
    assert positives == pytest.approx({"d4": products["d4"]}, rel=1e-4)
    best = sorted(products, key=lambda d: -products[d])[:6]  # depth + room for the one positive
    assert sorted(candidates) == sorted(best) and candidates == pytest.approx({d: products[d] for d in best}, rel=1e-4)
    assert all(-1 - 1e-5 <= s <= 1 + 1e-5 for s in [*candidates.values(), *positives.values()])  # cosines


def test_an_encoder_that_declares_normalisation_keeps_its_miner_key(tmp_path, monkeypatch):
    from workloads.kinds.dense.encoder import META_FILE
    from workloads.kinds.dense.mining import DenseMiner

    monkeypatch.setenv("ORCHESTRATE_CACHE_DIR", str(tmp_path / "cache"))
    sentence_transformers = tmp_path / "st"
    (sentence_transformers / "1_Pooling").mkdir(parents=True)
    (sentence_transformers / "1_Pooling" / "config.json").write_text('{"pooling_mode_mean_tokens": true}')
    (sentence_transformers / "modules.json").write_text(
        '[{"path": "", "type": "sentence_transformers.models.Transformer"}, '
        '{"path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}, '
        '{"path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]')
    ours = tmp_path / "ours"
    ours.mkdir()
    (ours / META_FILE).write_text('{"normalize": true}')
    collection = Collection("toy", {}, {}, {})
    for source in (sentence_transformers, ours):
        assert DenseMiner(collection, str(source), "x", MiningOptions()).key == "dense-x"


# ----------------------------------------------------------------------------- MarginMSE
def test_margin_mse_is_registered_and_matches_a_hand_value():
    assert "margin_mse" in RANKING_LOSSES
    rows = [{"query_id": "a", "query": "qa", "positive": "p1", "negative": "n1", "positive_score": 5.0, "negative_score": 1.0},
            {"query_id": "b", "query": "qb", "positive": "p2", "negative": "n2", "positive_score": 2.0, "negative_score": 3.0}]
    batch = triples_to_batch(rows)
    scores = torch.tensor([1.0, 0.5, 0.0, 2.0], requires_grad=True)
    loss = build_ranking_loss("margin_mse")
    value = loss(ModelOutputs(scores, torch.zeros(4, 2)), batch.structure)
    # margins: student 0.5 and -2.0; teacher 4.0 and -1.0 -> ((0.5 - 4)^2 + (-2 + 1)^2) / 2 = (12.25 + 1) / 2
    assert value.item() == pytest.approx(6.625)
    value.backward()
    assert scores.grad.abs().sum() > 0


def test_margin_mse_warns_once_of_a_cosine_teacher(project_log):
    def rows(positive, negative):
        return triples_to_batch([{"query_id": "a", "query": "q", "positive": "p", "negative": "n",
                                  "positive_score": positive, "negative_score": negative}])

    outputs = ModelOutputs(torch.tensor([4.0, -3.0]), torch.zeros(2, 2))
    logits = build_ranking_loss("margin_mse")
    logits(outputs, rows(6.5, -2.0).structure)
    assert not project_log.records  # a cross-encoder teacher's logits: on the student's scale
    cosines = build_ranking_loss("margin_mse")
    cosines(outputs, rows(0.82, 0.41).structure)
    warned = len(project_log.records)
    cosines(outputs, rows(0.82, 0.41).structure)
    assert len(project_log.records) == warned  # once per loss
    assert {r.getMessage() for r in project_log.records} == {
        "margin_mse: the teacher's scores all lie in [-1, 1] (cosines of a dense miner?), so its margins are at most 2 "
        "while the student scores logits; distil from a cross-encoder (training_data.mining.method: cross_encoder) or "
        "expect the student's margins to shrink to the teacher's"}


def test_margin_mse_per_query_lists_and_batches_without_a_teacher():
    row = {"query_id": "a", "query": "q", "positive": "p", "negative": "n1", "negative_ids": ["n1", "n2"],
           "negatives": ["n1", "n2"], "positive_score": 3.0, "negative_score": 1.0, "negative_scores": [1.0, 2.0]}
    batch = lists_to_batch([row])
    assert batch.structure.teacher.tolist() == [3.0, 1.0, 2.0]
    loss = build_ranking_loss("margin_mse")
    value = loss(ModelOutputs(torch.tensor([0.0, 0.0, 0.0]), torch.zeros(3, 2)), batch.structure)
    assert value.item() == pytest.approx((2.0 ** 2 + 1.0 ** 2) / 2)
    plain = triples_to_batch([{k: v for k, v in row.items() if "score" not in k}])
    assert plain.structure.teacher is None
    zero = loss(ModelOutputs(torch.zeros(2, requires_grad=True), torch.zeros(2, 2)), plain.structure)
    assert zero.item() == 0.0 and loss.degenerate_batches == 1


# ----------------------------------------------------------------------------- STS
STS_THREE = "4.5\tA man plays a guitar.\tA man is playing guitar.\n1.0\tA dog runs.\tThe stock market fell.\n" \
            "3.2\tA woman cuts onions.\tSomeone is slicing an onion.\n0.2\tKids play \"football\".\tRain in Spain.\n"
STS_BENCHMARK = "main-captions\tMSRvid\t2012test\t0001\t5.000\tA plane is taking off.\tAn air plane is taking off.\n" \
                "main-captions\tMSRvid\t2012test\t0004\t0.500\tA cat eats.\tA man drives.\tsource\n"
SICK = "pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment\n1\tA boy runs\tA kid runs\t4.6\tENTAILMENT\n" \
       "2\tA boy runs\tA cat sleeps\t1.2\tNEUTRAL\n"


def test_sts_files_in_every_layout(tmp_path):
    from workloads.kinds.dense.sts import read_sts

    for name, text, first, score in (("three.tsv", STS_THREE, "A man plays a guitar.", 4.5),
                                     ("sts-dev.csv", STS_BENCHMARK, "A plane is taking off.", 5.0),
                                     ("SICK.txt", SICK, "A boy runs", 4.6)):
        (tmp_path / name).write_text(text)
        pairs = read_sts(tmp_path / name)
        assert pairs.first[0] == first and pairs.scores[0] == score
    assert read_sts(tmp_path / "three.tsv").first[3] == 'Kids play "football".'  # quotes are text


def test_sts_spearman_equals_scipys_on_the_fixture(tmp_path, tiny_model_dir):
    from workloads.kinds.dense.encoder import BiEncoder
    from workloads.kinds.dense.sts import evaluate_sts, read_sts

    (tmp_path / "sts.tsv").write_text(STS_THREE)
    model = BiEncoder.from_pretrained(str(tiny_model_dir))
    result = evaluate_sts(model, tmp_path / "sts.tsv")
    pairs = read_sts(tmp_path / "sts.tsv")
    a = model.encode_documents(pairs.first)
    b = model.encode_documents(pairs.second)
    cosines = [float(x @ y / np.linalg.norm(x) / np.linalg.norm(y)) for x, y in zip(a, b)]
    assert result == {"spearman": pytest.approx(stats.spearmanr(cosines, [4.5, 1.0, 3.2, 0.2]).statistic), "pairs": 4.0}


@pytest.mark.parametrize("text, problem", [
    ("4.5\tonly one sentence\n", r"sts.tsv:1: 2 tab-separated columns"),
    ("high\ta\tb\n", r"sts.tsv:1: score 'high' is not a number"),
    ("index\tsentence1\tsentence2\n0\ta\tb\n", "no 'score' column"),
    ("", "no sentence pairs"),
])
def test_bad_sts_files_are_one_line(tmp_path, text, problem):
    from workloads.kinds.dense.sts import read_sts

    (tmp_path / "sts.tsv").write_text(text)
    with pytest.raises(InputError, match=problem) as raised:
        read_sts(tmp_path / "sts.tsv")
    assert "\n" not in str(raised.value)


# ----------------------------------------------------------------------------- first stages against BM25
def test_first_stage_comparison_reports_means_and_paired_p_values():
    from workloads.kinds.dense.evaluation import compare_first_stages, markdown_table

    qrels = {f"q{i}": {"good": 1} for i in range(6)}
    bm25 = {f"q{i}": {"bad": 2.0, "good": 1.0} for i in range(6)}
    dense = {f"q{i}": {"good": 2.0, "bad": 1.0} for i in range(6)}
    rows = compare_first_stages({"bm25": bm25, "dense": dense}, qrels)
    assert rows[0].p_values["ndcg_at_10"] is None
    assert rows[1].values["ndcg_at_10"] == pytest.approx(1.0) and rows[0].values["ndcg_at_10"] == pytest.approx(1 / np.log2(3))
    assert rows[1].p_values["ndcg_at_10"] == 0.0 and rows[1].p_values["recall_at_1000"] == 1.0  # constant gain; no change
    assert "| dense | 1.0000† |" in markdown_table(rows)


# ----------------------------------------------------------------------------- in a re-ranking trial
@pytest.mark.parametrize("mining, problem", [
    ({"method": "dense"}, "needs one of run .* or model"),
    ({"method": "cross_encoder", "model": "m", "run": "r.yaml"}, "needs model .*not run"),
    ({"method": "dense", "model": "m", "depth": 5, "skip_top": 5}, "skip_top 5 leaves no candidate of depth 5"),
    ({"method": "dense", "model": "m", "sampling": "best"}, "sampling"),
    ({"method": "bm25", "model": "m"}, "Input should be 'dense' or 'cross_encoder'"),  # the miner registry's names
])
def test_bad_mining_settings_are_refused(mining, problem):
    from pydantic import ValidationError

    from workloads.kinds.rerank.spec import TrialSpec

    with pytest.raises(ValidationError, match=problem):
        TrialSpec.model_validate({"name": "t", "data": {"collection": "c"}, "model": {"name": "m"},
                                  "training_data": {"mining": mining}})


def test_unmined_trials_keep_their_keys_and_mined_ones_differ():
    from workloads.kinds.rerank.identity import rerank_key
    from workloads.kinds.rerank.spec import TrialSpec

    base = {"name": "t", "data": {"collection": "c"}, "model": {"name": "m"}}
    plain = TrialSpec.model_validate(base)
    assert "mining" not in plain.model_dump_json()  # the dump every key hashes is the one before mining existed
    mined = TrialSpec.model_validate({**base, "training_data": {"mining": {"method": "dense", "model": "minilm-l6"}}})
    assert rerank_key(mined) != rerank_key(plain)
    assert TrialSpec.model_validate(mined.model_dump(mode="json")) == mined


def test_only_trials_mined_by_an_encoder_that_does_not_normalise_moved_their_keys(tmp_path, monkeypatch):
    from workloads.kinds.dense import encoder
    from workloads.kinds.rerank.identity import rerank_key
    from workloads.kinds.rerank.spec import TrialSpec

    def key(model):
        return rerank_key(TrialSpec.model_validate({"name": "t", "data": {"collection": "c"}, "model": {"name": "m"},
                                                    "training_data": {"mining": {"method": "dense", "model": model}}}))

    assert key("minilm-l6") == "84f85d3de1babeac"  # MiniLM normalises: mined as before issue 57, the same key
    (tmp_path / "config.json").write_text("{}")  # a plain checkpoint: mined by cosine now, by raw products before
    moved = key(str(tmp_path))
    monkeypatch.setattr(encoder, "declared_normalization", lambda name: True)  # as if it normalised: the former key
    assert key(str(tmp_path)) != moved


def test_a_mining_dense_trial_is_keyed_by_its_identity_not_its_files_path(tmp_path):
    """As a dense first stage's ``run``: a moved file is the same trial, an edited one another."""
    import yaml

    from workloads.kinds.rerank.identity import rerank_key
    from workloads.kinds.rerank.spec import TrialSpec

    dense = {"kind": "dense", "name": "miner", "data": {"collection": "beir/scifact"}, "model": {"name": "minilm-l6"},
             "dense": {"learning_rate": 2e-5}}
    keys = []
    for folder, learning_rate in (("a", 2e-5), ("b", 2e-5), ("c", 3e-5)):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "dense.yaml").write_text(yaml.safe_dump({**dense, "dense": {"learning_rate": learning_rate}}))
        keys.append(rerank_key(TrialSpec.model_validate({
            "name": "t", "data": {"collection": "beir/scifact"}, "model": {"name": "m"},
            "training_data": {"mining": {"method": "dense", "run": str(tmp_path / folder / "dense.yaml")}}})))
    assert keys[0] == keys[1] != keys[2]


@pytest.mark.slow  # encodes SciFact with a tiny encoder and trains a tiny cross-encoder twice
def test_a_reranking_trial_on_a_hybrid_first_stage_with_dense_mined_negatives(tmp_path, tiny_model_dir, scifact_dir):
    from workloads.kinds import run_in_process
    from workloads.kinds.rerank.spec import TrialSpec

    spec = TrialSpec.model_validate({
        "name": "hybrid-mined", "data": {"collection": "beir/scifact", "validation_queries": 5},
        "first_stage": {"method": "hybrid", "model": str(tiny_model_dir), "train_depth": 10, "validation_depth": 5,
                        "test_depth": 3},
        "training_data": {"size": 16, "seed": 3, "mining": {"method": "dense", "model": str(tiny_model_dir), "depth": 20,
                                                            "skip_top": 2}},
        "model": {"name": str(tiny_model_dir), "max_length": 64}, "loss": {"ranking": "margin_mse"},
        "optimization": {"epochs": 1, "batch_size": 8, "learning_rate": 1e-3},
    })
    prepared, records, tested = run_in_process(spec, tmp_path / "checkpoints")
    rows = pq.read_table(prepared.training.training_set).to_pylist()
    assert len(rows) == 8 and all(r["positive_score"] is not None and r["negative_score"] is not None for r in rows)
    assert records[0].metrics["epoch"] == 1 and tested.evaluation.num_queries == 300
