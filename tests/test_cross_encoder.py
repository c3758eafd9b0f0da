"""The cross-encoder returns (score, Phi), truncates only documents, and round-trips checkpoints."""

import pytest
import torch

from workloads.errors import InputError
from workloads.models.cross_encoder import CrossEncoder, resolve_model_name, score_pairs


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    torch.manual_seed(0)
    return CrossEncoder.from_pretrained(str(tiny_model_dir), max_length=32)


def test_scores_and_phi_shapes(model):
    pairs = model.encode(["what purrs", "dogs"], ["cats purr loudly", "a dog barks at night"])
    scores, phi = model(**pairs.inputs)
    assert scores.shape == (2,) and phi.shape == (2, model.encoder.config.hidden_size)
    # Phi is the first ([CLS]) position of the last layer; the score is the head on it
    assert torch.allclose(model.score_head(phi).squeeze(-1), scores)


def test_document_is_truncated_query_kept(model):
    long_doc = " ".join(["word"] * 500)
    pairs = model.encode(["a fairly specific question"], [long_doc])
    ids = pairs.inputs["input_ids"][0].tolist()
    assert len(ids) == 32
    query_ids = model.tokenizer("a fairly specific question", add_special_tokens=False)["input_ids"]
    assert ids[1:1 + len(query_ids)] == query_ids


def test_checkpoint_round_trip_gives_same_scores(model, tmp_path):
    with torch.no_grad():
        model.score_head.bias.fill_(0.25)
    queries, docs = ["q one", "q two", "q three"], ["doc a is here", "doc b", "a longer doc c with more words"]
    before = score_pairs(model, queries, docs, batch_size=2)
    model.save(tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "model.safetensors").exists()
    reloaded = CrossEncoder.from_pretrained(str(tmp_path / "ckpt"), max_length=512)
    assert reloaded.max_length == 32
    assert score_pairs(reloaded, queries, docs, batch_size=3) == pytest.approx(before, abs=1e-5)


def test_minilm_alias_resolves_offline():
    import os

    path = resolve_model_name("minilm-l6")
    assert os.path.isdir(path) and os.path.exists(os.path.join(path, "config.json"))


def test_missing_model_is_input_error(tmp_path):
    with pytest.raises(InputError, match="cannot load model"):
        CrossEncoder.from_pretrained(str(tmp_path / "nope"))


def test_query_longer_than_max_length_is_cut_not_an_error(model):
    pairs = model.encode([" ".join(["query"] * 100)], ["short doc"])
    assert pairs.inputs["input_ids"].shape[1] == 32
