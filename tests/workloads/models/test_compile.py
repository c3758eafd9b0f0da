"""``optimization.compile``: the encoder compiled in place computes what the eager one does,
dropout masks included, keeps its parameters (checkpoints unchanged), and one graph serves
every padded length."""

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from torch._dynamo.utils import counters
from torch._inductor import config as inductor_config

from workloads.core.errors import InputError
from workloads.models import cross_encoder
from workloads.models.cross_encoder import CrossEncoder, compile_encoder, score_pairs


def _batch(model, texts: int, words: int):
    queries = [f"query {i} about cells" for i in range(texts)]
    documents = [" ".join(f"w{i}x{j}" for j in range(words + i)) for i in range(texts)]
    return model.encode(queries, documents).inputs


@pytest.mark.slow  # inductor compiles the forward and backward graphs: ~30 s on 2 cores
def test_a_compiled_encoder_trains_like_the_eager_one_with_one_graph_for_every_length(tiny_model_dir):
    torch.manual_seed(0)
    eager = CrossEncoder.from_pretrained(str(tiny_model_dir), max_length=64)
    compiled = copy.deepcopy(eager)
    compile_encoder(compiled)
    # the same parameters under the same names: checkpoints and optimizer states are the eager model's
    assert list(compiled.state_dict()) == list(eager.state_dict())
    torch._dynamo.reset()
    counters.clear()
    optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (eager, compiled)]
    for step, words in enumerate((5, 9, 14)):  # three padded lengths
        inputs = _batch(eager, 4, words)
        losses = []
        for model, optimizer in zip((eager, compiled), optimizers):
            model.train()
            torch.manual_seed(100 + step)  # dropout on: both must draw the same masks
            scores, _ = model(**inputs)
            loss = torch.nn.functional.binary_cross_entropy_with_logits(scores, torch.tensor([1.0, 0.0, 1.0, 0.0]))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.detach())
        torch.testing.assert_close(losses[1], losses[0], rtol=1e-4, atol=1e-5)
    for (name, before), after in zip(eager.named_parameters(), compiled.parameters()):
        torch.testing.assert_close(after, before, rtol=1e-4, atol=1e-5, msg=name)
    assert next(iter(eager.parameters())).grad is not None
    assert counters["stats"]["unique_graphs"] == 1  # dynamic shapes: lengths 2 and 3 reused the first graph
    assert inductor_config.fallback_random is False  # eager-like dropout for our graphs, not the process's
    # and it scores, without gradients, as the eager model does

    queries, documents = ["q one", "q two longer query"], ["a document", "another document, a longer one"]
    torch.testing.assert_close(torch.tensor(score_pairs(compiled, queries, documents, precision="fp32")),
                               torch.tensor(score_pairs(eager, queries, documents, precision="fp32")), rtol=1e-4, atol=1e-5)


def test_compile_without_a_cxx_compiler_is_refused_with_one_line(monkeypatch):
    # inductor's own patch, not monkeypatch: pytest's undo deletes an attribute it did not find in the
    # proxy's __dict__, and a deleted inductor setting stays hidden for every later compile in the process
    with inductor_config.patch({"cpp.cxx": (None, "g++")}):  # what inductor searches where CXX is unset
        monkeypatch.setenv("PATH", "/nonexistent")
        with pytest.raises(InputError, match=r"optimization.compile: torch.compile needs a C\+\+ compiler"):
            cross_encoder.require_compiler()
        monkeypatch.setenv("PATH", "/usr/bin:/bin")
        cross_encoder.require_compiler()  # this machine has one
    assert inductor_config.cpp.cxx[1]  # the setting is still there for the compiles after this test


def test_orchestrate_run_refuses_compile_without_a_compiler_before_anything_is_tracked(tmp_path):
    config = {"name": "compiled", "data": {"collection": "beir/scifact"}, "model": {"name": "minilm-l6"},
              "optimization": {"epochs": 1, "compile": True}}
    path = tmp_path / "compiled.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {k: v for k, v in os.environ.items() if k != "CXX"}
    env["PATH"] = str(Path(sys.executable).parent)  # python and nothing else: no g++
    proc = subprocess.run([sys.executable, "-m", "orchestrator.cli", "run", str(path), "--tracking-uri",
                           f"sqlite:///{tmp_path / 'mlflow.db'}", "--storage", str(tmp_path / "store")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert proc.returncode == 2 and len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "optimization.compile: torch.compile needs a C++ compiler and none is on PATH (g++;" in errors[0]
    assert not (tmp_path / "store").exists()
    if (tmp_path / "mlflow.db").exists():  # nothing tracked for a trial that could not start
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
        assert [e.name for e in client.search_experiments()] == ["Default"] and not client.search_runs(["0"])
