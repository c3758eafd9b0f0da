"""WikiQA from its official files, and the `given` and `run` first stages against hand-made data."""

import gzip
import os
from pathlib import Path
from types import SimpleNamespace

import ir_measures
import pyarrow.parquet as pq
import pytest

import workloads.kinds.rerank.train as training
from orchestrator.lifecycle.targets import targets
from tests.workloads.data.test_collections import write_beir
from workloads.core.errors import InputError
from workloads.data.collections import Collection
from workloads.data.resolve import resolve_collection
from workloads.data.wikiqa import load_wikiqa_directory
from workloads.kinds import run_in_process as run_trial_in_process
from workloads.kinds.rerank.spec import TrialSpec
from workloads.kinds.rerank.steps import prepare_trial
from workloads.retrieval.bm25 import read_trec_run
from workloads.retrieval.first_stage import first_stage_run
from workloads.spec import FirstStageSpec

HEADER = "QuestionID\tQuestion\tDocumentID\tDocumentTitle\tSentenceID\tSentence\tLabel\n"


def write_wikiqa(root: Path) -> Path:
    """A WikiQA-shaped directory: 4 train questions (tokenised .txt.gz + .ref), dev and test TSVs
    with filtered .ref files (one test question has no answer, one only answers)."""
    root.mkdir(parents=True, exist_ok=True)
    train = [("how do cats purr ?", [("cats purr with their larynx .", 1), ("dogs bark .", 0), ("cats sleep .", 0)]),
             ("what do dogs eat ?", [("dogs eat meat .", 1), ("cats eat fish .", 0)]),
             ("why is the sky blue ?", [("rayleigh scattering makes it blue .", 1), ("grass is green .", 0)]),
             ("who wrote hamlet ?", [("shakespeare wrote it .", 0), ("it is a play .", 0)])]
    lines, ref = [], []
    for qi, (question, sentences) in enumerate(train, 1):
        for si, (sentence, label) in enumerate(sentences):
            lines.append(f"{question}\t{sentence}\t{label}\n")
            ref.append(f"{qi} 0 {si} {label}\n")
    with gzip.open(root / "WikiQA-train.txt.gz", "wt") as out:
        out.writelines(lines)
    (root / "WikiQA-train.ref").write_text("".join(ref))
    splits = {
        "dev": [("Q1", "what purrs", "D1", [("D1-0", "A cat purrs.", 1), ("D1-1", "A dog barks.", 0)])],
        "test": [("Q2", "what is a cat", "D2", [("D2-0", "A dog is a pet.", 0), ("D2-1", "A cat is a feline.", 1),
                                                  ("D2-2", "Cats purr.", 0)]),
                 ("Q3", "who wrote hamlet", "D3", [("D3-0", "Hamlet is a play.", 0), ("D3-1", "It is long.", 0)]),
                 ("Q4", "what is green", "D4", [("D4-0", "Grass is green.", 1)]),
                 ("Q5", "why do dogs bark", "D5", [("D5-0", "Dogs run.", 0), ("D5-1", "Dogs bark at strangers.", 1)])],
    }
    for split, questions in splits.items():
        rows, refs, filtered = [HEADER], [], []
        for qi, (qid, question, did, sentences) in enumerate(questions, 1):
            labels = [label for _, _, label in sentences]
            for si, (sid, sentence, label) in enumerate(sentences):
                rows.append(f"{qid}\t{question}\t{did}\tTitle\t{sid}\t{sentence}\t{label}\n")
                refs.append(f"{qi} 0 {si} {label}\n")
                if 0 < sum(labels) < len(labels):
                    filtered.append(f"{qi} 0 {si} {label}\n")
        (root / f"WikiQA-{split}.tsv").write_text("".join(rows))
        (root / f"WikiQA-{split}.ref").write_text("".join(refs))
        (root / f"WikiQA-{split}-filtered.ref").write_text("".join(filtered))
    return root


def test_the_real_wikiqa_split_counts():
    path = Path(os.environ["ORCHESTRATE_DATA_DIR"]) / "wikiqa"
    if not path.is_dir():
        pytest.fail(f"WikiQA not found at {path}: set ORCHESTRATE_DATA_DIR to the data directory")
    collection = resolve_collection(str(path))
    counts = {split: (len(qrels), sum(map(len, qrels.values())), sum(sum(q.values()) for q in qrels.values()))
              for split, qrels in collection.qrels.items()}
    # (questions, candidate rows, correct answers): PROVENANCE.md's numbers
    assert counts == {"train": (2118, 20360, 1040), "dev": (122, 1126, 136), "dev-unfiltered": (296, 2733, 140),
                      "test": (237, 2341, 283), "test-unfiltered": (633, 6165, 293),
                      "dev-answered": (126, 1130, 140), "test-answered": (243, 2351, 293)}
    # the answered sets, counted from the official TSV itself: every question with a correct candidate
    for split in ("dev", "test"):
        rows = [line.split("\t") for line in (path / f"WikiQA-{split}.tsv").read_text().splitlines()[1:]]
        assert set(collection.split_qrels(f"{split}-answered")) == {r[0] for r in rows if r[6].strip() == "1"}
        assert collection.given[f"{split}-answered"].keys() == collection.split_qrels(f"{split}-answered").keys()
    answered = sum(1 for q in collection.split_qrels("train").values() if any(q.values()))
    assert answered == 873
    # the filtered sets: at least one correct and one incorrect candidate per question
    assert all(0 < sum(q.values()) < len(q) for q in collection.split_qrels("test").values())
    q0 = collection.given["test"]["Q0"]  # the official order: descending given scores
    assert list(q0) == [f"D0-{i}" for i in range(6)] and list(q0.values()) == [6.0, 5.0, 4.0, 3.0, 2.0, 1.0]


def test_a_hand_made_wikiqa_directory(tmp_path):
    collection = resolve_collection(str(write_wikiqa(tmp_path / "wikiqa")))
    assert collection.split_qrels("test") == {"Q2": {"D2-0": 0, "D2-1": 1, "D2-2": 0}, "Q5": {"D5-0": 0, "D5-1": 1}}
    assert sorted(collection.split_qrels("test-unfiltered")) == ["Q2", "Q3", "Q4", "Q5"]
    assert collection.split_qrels("train")["T1"] == {"T1-0": 1, "T1-1": 0, "T1-2": 0}
    assert collection.queries["T3"] == "why is the sky blue ?" and collection.document("T3-0").text.startswith("rayleigh")
    assert list(collection.given["test"]["Q2"]) == ["D2-0", "D2-1", "D2-2"]


def test_wikiqa_files_that_disagree_are_clear_errors(tmp_path):
    root = write_wikiqa(tmp_path / "wikiqa")
    (root / "WikiQA-dev.ref").write_text("1 0 0 0\n1 0 1 0\n")  # the TSV says 1 for the first row
    with pytest.raises(InputError, match=r"WikiQA-dev.tsv:2: label 1 disagrees with WikiQA-dev.ref \(0\)"):
        load_wikiqa_directory(root)
    (root / "WikiQA-dev.ref").write_text("1 0 0 1\n")
    with pytest.raises(InputError, match="2 rows but WikiQA-dev.ref has 1"):
        load_wikiqa_directory(root)


def _trial(collection: str, model: Path, first_stage: dict) -> TrialSpec:
    return TrialSpec.model_validate({
        "name": "lists", "data": {"collection": collection, "train_split": "train", "validation_split": "dev",
                                  "test_split": "test"},
        "first_stage": {"train_depth": 10, "validation_depth": 10, "test_depth": 10, **first_stage},
        "training_data": {"size": "full"}, "model": {"name": str(model), "max_length": 32}})


def _ir_measures(run_path: Path, qrels) -> dict[str, float]:
    measures = [ir_measures.parse_measure(m) for m in ("nDCG@10", "AP(rel=1)", "RR(rel=1)@10")]
    run = read_trec_run(run_path)
    return {str(m): v for m, v in ir_measures.calc_aggregate(measures, qrels, run).items()}


def test_given_first_stage_re_ranks_the_collections_own_lists(tmp_path, tiny_model_dir):
    root = write_wikiqa(tmp_path / "wikiqa")
    prepared = prepare_trial(_trial(str(root), tiny_model_dir, {"method": "given"}))
    run = read_trec_run(Path(prepared.test_first_stage_run))
    assert run == {"Q2": {"D2-0": 3.0, "D2-1": 2.0, "D2-2": 1.0}, "Q5": {"D5-0": 2.0, "D5-1": 1.0}}
    expected = _ir_measures(Path(prepared.test_first_stage_run), prepared.test_qrels)
    assert prepared.first_stage_test.aggregate["ndcg_at_10"] == pytest.approx(expected["nDCG@10"])
    assert prepared.first_stage_test.aggregate["ap"] == pytest.approx(expected["AP"]) == pytest.approx((1 / 2 + 1 / 2) / 2)
    # training negatives come from the same lists: every triple's negative is in its question's list
    triples = pq.read_table(prepared.training.training_set).to_pylist()
    assert {(t["query_id"], t["positive_id"]) for t in triples} == {("T1", "T1-0"), ("T2", "T2-0"), ("T3", "T3-0")}
    assert all(t["negative_id"].startswith(t["query_id"] + "-") for t in triples)
    candidates = pq.read_table(prepared.test_candidates).to_pylist()
    assert sorted((c["query_id"], c["doc_id"]) for c in candidates) == [("Q2", "D2-0"), ("Q2", "D2-1"), ("Q2", "D2-2"),
                                                                          ("Q5", "D5-0"), ("Q5", "D5-1")]


def test_run_file_first_stage_reads_any_trec_run(tmp_path, tiny_model_dir):
    root = write_wikiqa(tmp_path / "wikiqa")
    run_file = tmp_path / "top.trec"
    lines = ["T1 Q0 T1-2 1 9 x", "T1 Q0 T1-0 2 8 x", "T1 Q0 T1-1 3 7 x", "T2 Q0 T2-1 1 5 x", "T2 Q0 T2-0 2 4 x",
             "Q1 Q0 D1-1 1 3 x", "Q1 Q0 D1-0 2 2 x", "Q2 Q0 D2-2 1 3 x", "Q2 Q0 D2-1 2 2 x", "Q2 Q0 D2-0 3 1 x"]
    run_file.write_text("\n".join(lines) + "\n")  # Q5 is not ranked: it counts 0
    prepared = prepare_trial(_trial(str(root), tiny_model_dir, {"method": "run", "path": str(run_file)}))
    assert read_trec_run(Path(prepared.test_first_stage_run)) == {"Q2": {"D2-2": 3.0, "D2-1": 2.0, "D2-0": 1.0}}
    expected = _ir_measures(Path(prepared.test_first_stage_run), prepared.test_qrels)
    # Q5 counts 0 (trec_eval -c): the mean over both judged queries is half of Q2's 0.5
    assert prepared.first_stage_test.aggregate["ap"] == pytest.approx(expected["AP"]) == pytest.approx(0.25)
    assert prepared.first_stage_test.per_query["ap"]["Q5"] == 0.0


def test_first_stage_options_are_checked(tmp_path, tiny_model_dir):
    with pytest.raises(ValueError, match="method 'run' needs path"):
        _trial("x", tiny_model_dir, {"method": "run"})
    with pytest.raises(ValueError, match="k1 and b belong to bm25"):
        _trial("x", tiny_model_dir, {"method": "given", "k1": 1.2})
    with pytest.raises(ValueError, match="path has no effect"):
        _trial("x", tiny_model_dir, {"path": "run.trec"})
    with pytest.raises(InputError, match="no such run file"):
        prepare_trial(_trial(str(write_wikiqa(tmp_path / "w")), tiny_model_dir, {"method": "run", "path": str(tmp_path / "no.trec")}))
    beir = tmp_path / "beir"

    write_beir(beir)
    with pytest.raises(InputError, match="no given candidates for split 'test'"):
        resolve_collection(str(beir)).given_candidates("test")


@pytest.mark.parametrize("batching", ["per_query", "cft"])
def test_list_batches_train_a_trial_on_given_lists(tmp_path, tiny_model_dir, batching, monkeypatch):
    """A whole trial in-process on the hand-made WikiQA: the training loop composes the
    chosen batches (spied) and MHL + TML train on them."""
    root = write_wikiqa(tmp_path / "wikiqa")
    seen = []
    real = training.make_batch
    monkeypatch.setattr(training, "make_batch", lambda rows, planned, mode: seen.append(real(rows, planned, mode)) or seen[-1])
    optimization = {"per_query": {"batching": "per_query", "batch_size": 2},
                    "cft": {"batching": "cft", "batch_size": 3, "cft_positives": 2}}[batching]
    spec = TrialSpec.model_validate({
        "name": "lists", "data": {"collection": str(root), "validation_split": "dev"},
        "first_stage": {"method": "given", "train_depth": 10, "validation_depth": 10, "test_depth": 10},
        "training_data": {"size": "full", "negatives": 1},
        "model": {"name": str(tiny_model_dir), "max_length": 32},
        "loss": {"ranking": "mhl", "contrastive": "tml", "tml_anchors": "all"},
        "optimization": {"epochs": 1, "learning_rate": 1e-3, **optimization}})
    _, records, tested = run_trial_in_process(spec, tmp_path / "checkpoints")
    assert len(seen) == 3 and records[0].metrics["train_loss"] >= 0  # three answered training questions, one per step
    for batch in seen:
        s = batch.structure
        if batching == "per_query":
            assert s.labels.tolist() == [1.0, 0.0] and len(set(s.query_ids.tolist())) == 1
        else:  # one list (1 + 1) and the positive of another query
            assert s.labels.tolist() == [1.0, 0.0, 1.0] and s.query_ids.tolist()[2] != s.query_ids.tolist()[0]
    assert tested.evaluation.num_queries == 2


def test_a_zero_shot_target_can_have_its_own_first_stage(tmp_path, tiny_model_dir):
    """Transfer from WikiQA (given lists) to a BEIR collection (no lists: BM25 there): the
    target's test side uses its own first stage; the training side stays the trial's."""
    root = write_wikiqa(tmp_path / "wikiqa")
    beir = write_beir(tmp_path / "beir")
    spec = _trial(str(root), tiny_model_dir, {"method": "given"})
    plain, own = targets(spec, [(str(beir), "test"), (str(beir), "test", FirstStageSpec(method="bm25", test_depth=5))])[1:]
    with pytest.raises(InputError, match="no given candidates for split 'test'"):
        prepare_trial(plain.spec)
    prepared = prepare_trial(own.spec)
    assert set(read_trec_run(Path(prepared.test_first_stage_run))) == {"q1"}  # BM25 on the BEIR queries
    trained_on = prepare_trial(spec)
    assert prepared.training.training_set == trained_on.training.training_set  # same training data


def test_scoreddocs_streams_the_run_a_collection_ships(monkeypatch, tmp_path):
    """first_stage scoreddocs: an ir_datasets collection's own run (MS MARCO document's official
    top-100), read through ir_datasets (here a stand-in: nothing is downloaded), restricted to the
    asked queries, cut to k with trec_eval's tie order; a split without a run is one line."""
    import ir_datasets


    scored = [("q1", "a", 3.0), ("q1", "b", 5.0), ("q1", "c", 5.0), ("q2", "a", 1.0), ("q3", "d", 2.0), ("q3", "e", 9.0)]
    subsets = {"stand-in/train": SimpleNamespace(has_qrels=lambda: True, has_scoreddocs=lambda: True,
                                                 scoreddocs_iter=lambda: iter(SimpleNamespace(query_id=q, doc_id=d, score=s)
                                                                              for q, d, s in scored)),
               "stand-in/dev": SimpleNamespace(has_qrels=lambda: True, has_scoreddocs=lambda: False),
               "stand-in": SimpleNamespace(has_qrels=lambda: False)}
    monkeypatch.setattr(ir_datasets, "load", lambda ref: subsets[ref] if ref in subsets else (_ for _ in ()).throw(KeyError(ref)))
    collection = Collection("stand-in", None, {"q1": "x", "q2": "y", "q3": "z"}, {"train": {}, "dev": {}})
    run = first_stage_run(collection, "train", {"q1": "x", "q3": "z"}, 2, FirstStageSpec(method="scoreddocs"))
    assert read_trec_run(run.path) == {"q1": {"b": 5.0, "c": 5.0}, "q3": {"e": 9.0, "d": 2.0}}
    assert run.path.read_text().splitlines()[0] == "q1 Q0 c 1 5.000000 scoreddocs"  # tied: trec_eval's order, c before b
    with pytest.raises(InputError, match="stand-in: first_stage scoreddocs: split 'dev' ships no run"):
        first_stage_run(collection, "dev", {"q2": "y"}, 2, FirstStageSpec(method="scoreddocs"))
    scored.append(("q1", "f", 1.0))  # q1 again after q3: not grouped by query
    with pytest.raises(InputError, match="scoreddocs of query 'q1' are not grouped by query"):
        first_stage_run(collection, "train", {"q1": "x"}, 3, FirstStageSpec(method="scoreddocs"))


def test_rm3_first_stage_finds_what_the_feedback_terms_match(tmp_path, monkeypatch):
    """RM3 expands the query with terms of its top documents: here the one document that says
    "purr" also says "felines", so RM3 also retrieves the document about felines that BM25,
    matching "purr" only, never ranks."""
    monkeypatch.setenv("ORCHESTRATE_CACHE_DIR", str(tmp_path / "cache"))
    # (Anserini's relevance model skips terms in more than a tenth of the documents: filler makes
    # "felines" rare enough to be fed back)
    filler = [{"_id": f"f{i}", "title": "", "text": f"dogs bark at stranger number {i}"} for i in range(30)]
    docs = [{"_id": "d1", "title": "", "text": "cats purr and felines purr"},
            {"_id": "d3", "title": "", "text": "felines hunt felines sleep"}, *filler]
    collection = resolve_collection(str(write_beir(tmp_path / "c", corpus_lines=docs)))
    queries = {"q1": "purr"}
    bm25 = first_stage_run(collection, "test", queries, 10, FirstStageSpec()).run
    rm3 = first_stage_run(collection, "test", queries, 10, FirstStageSpec(method="rm3", fb_docs=1, fb_terms=5)).run
    assert set(bm25["q1"]) == {"d1"}
    assert set(rm3["q1"]) == {"d1", "d3"} and rm3["q1"]["d1"] > rm3["q1"]["d3"]
