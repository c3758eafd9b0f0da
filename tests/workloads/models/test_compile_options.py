"""``optimization.compile``: true (dynamic shapes, as before) or a mapping {mode, dynamic}; fixed
shapes for CUDA graphs. Old files validate and key as before."""

import copy

import pytest
import torch

from orchestrator.core.config import load_spec
from orchestrator.lifecycle.identity import trial_key
from workloads.core.errors import InputError
from workloads.kinds.rerank.spec import CompileSpec, TrialSpec
from workloads.models.cross_encoder import CrossEncoder, compile_encoder, score_pairs

BASE = {"name": "x", "data": {"collection": "beir/scifact"}, "model": {"name": "minilm-l6", "max_length": 128}}


def spec_with(compile_value) -> TrialSpec:
    return TrialSpec.model_validate({**BASE, "optimization": {"compile": compile_value}})


def test_old_values_and_the_empty_mapping_keep_their_trial_keys():
    # the keys these specs had at 617b804, before the mapping existed
    assert trial_key(TrialSpec.model_validate(BASE)) == trial_key(spec_with(False)) == "761b677795444a3d"
    assert trial_key(spec_with(True)) == trial_key(spec_with({})) == "f85aa18af6bcee22"
    assert spec_with({}).optimization.compile is True
    fixed = spec_with({"mode": "reduce-overhead", "dynamic": False})
    assert fixed.optimization.compile == CompileSpec(mode="reduce-overhead", dynamic=False)
    keys = {trial_key(spec_with(v)) for v in ({"dynamic": False}, {"mode": "reduce-overhead", "dynamic": False},
                                               {"mode": "max-autotune-no-cudagraphs"})}
    assert len(keys) == 3 and not keys & {"761b677795444a3d", "f85aa18af6bcee22"}
    assert TrialSpec.model_validate_json(fixed.model_dump_json()) == fixed  # a dumped spec validates again


def test_compile_options_name_what_compile_encoder_takes():
    assert spec_with(False).optimization.compile_options is None
    assert spec_with(True).optimization.compile_options == {"mode": "default", "dynamic": True}
    assert spec_with({"mode": "reduce-overhead", "dynamic": False}).optimization.compile_options == {
        "mode": "reduce-overhead", "dynamic": False}


@pytest.mark.parametrize("value, message", [
    ("{mode: reduce-overhead}", r"optimization.compile: mode reduce-overhead records CUDA graphs, which need fixed shapes: "
                                r"set dynamic: false$"),
    ("{mode: fast, dynamic: false}", r"optimization.compile: mode: Input should be 'default', 'reduce-overhead'"),
    ("{dynamics: false}", r"optimization.compile: dynamics: Extra inputs are not permitted$"),
    ("sometimes", r"optimization.compile: give true, false or a mapping such as \{mode: reduce-overhead, dynamic: false\}"),
])
def test_a_wrong_compile_value_gets_one_line_naming_it(tmp_path, value, message):
    path = tmp_path / "trial.yaml"
    path.write_text(f"name: x\ndata: {{collection: beir/scifact}}\nmodel: {{name: minilm-l6}}\noptimization:\n  compile: {value}\n")
    with pytest.raises(InputError, match=r"trial.yaml:5: " + message) as caught:
        load_spec(path, TrialSpec)
    assert "\n" not in str(caught.value) and "(and 1 more)" not in str(caught.value)


def test_compile_encoder_keeps_the_old_call_and_fixes_shapes_on_request(tiny_model_dir, monkeypatch):
    calls = []
    model = CrossEncoder.from_pretrained(str(tiny_model_dir), max_length=64)
    monkeypatch.setattr(model.encoder, "compile", lambda **kwargs: calls.append(kwargs))
    compile_encoder(model, **spec_with(True).optimization.compile_options)
    assert calls == [{"dynamic": True, "options": {"fallback_random": True}}] and not model.fixed_shapes
    compile_encoder(model, **spec_with({"mode": "reduce-overhead", "dynamic": False}).optimization.compile_options)
    assert calls[1] == {"dynamic": False, "mode": "reduce-overhead"} and model.fixed_shapes
    assert model.encode(["a query"], ["a document"]).inputs["input_ids"].shape == (1, 64)


@pytest.mark.slow  # inductor compiles the forward and backward graphs at fixed shapes: ~1-3 min on 2 cores
def test_a_fixed_shape_encoder_trains_and_scores_with_and_without_the_mask(tiny_model_dir):

    torch.manual_seed(0)
    eager = CrossEncoder.from_pretrained(str(tiny_model_dir), max_length=24)
    fixed = copy.deepcopy(eager)
    compile_encoder(fixed, dynamic=False)
    full = ["a query about cells", "another query"], [" ".join(["cells divide"] * 20), " ".join(["genes"] * 30)]
    short = ["a query", "q"], ["short", " ".join(["genes"] * 30)]
    assert "attention_mask" not in fixed.encode(*full).inputs and "attention_mask" in fixed.encode(*short).inputs
    optimizer = torch.optim.AdamW(fixed.parameters(), lr=1e-3)
    fixed.train()
    for queries, documents in (full, short, full):
        scores, _ = fixed(**fixed.encode(queries, documents).inputs)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(scores, torch.tensor([1.0, 0.0]))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        assert torch.isfinite(loss)
    eager.load_state_dict(fixed.state_dict())  # the same weights: eval scores agree up to rounding
    for queries, documents in (full, short):
        torch.testing.assert_close(torch.tensor(score_pairs(fixed, queries, documents, precision="fp32")),
                                   torch.tensor(score_pairs(eager, queries, documents, precision="fp32")), rtol=1e-4, atol=1e-5)
