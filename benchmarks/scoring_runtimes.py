"""Our scorer (PyTorch eager, fp32) against other CPU inference runtimes for the same model.

Which runtime would score a re-ranker's candidates fastest on this CPU, and would the scores
stay the same? Side by side in one process, the same MiniLM-L6 cross-encoder (its score head
included), the same pairs (each configuration's training pairs, repeated to --score-pairs),
length-sorted batches of --batch (as ``score_pairs`` does), the same tokenization and the
same thread count:

- ``torch``: ``workloads.models.cross_encoder.score_pairs`` at fp32 (what trials and tests run);
- ``torch int8``: PyTorch's dynamic int8 quantization of every linear layer (x86 engine);
- ``onnxruntime``: the model exported with ``torch.onnx.export``, all graph optimizations;
- ``onnxruntime fused``: the same after ``onnxruntime.transformers``' BERT fusions;
- ``openvino`` / ``openvino bf16``: ``openvino.convert_model`` of the module, compiled for
  CPU with an f32 / bf16 inference precision hint.

The runtimes are measured in turns, repeated --repeats times (medians; one untimed pass of
each first), with the largest absolute score difference from ``torch``. Runtimes that are
not installed are left out (``pip install -e '.[runtimes]'``; never runtime dependencies).
Prints a table and writes JSON.

    ORCHESTRATE_DATA_DIR=/path/to/data python benchmarks/scoring_runtimes.py \
        [--score-pairs 512] [--batch 64] [--threads 2] [--repeats 3] [--out benchmarks/results/scoring_runtimes.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _results import write_results  # noqa: E402  (benchmarks/ is sys.path[0])
from vs_sentence_transformers import training_pairs, trial_spec  # noqa: E402

INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def scorer_module(model):
    """The cross-encoder as a module from the tokenizer's tensors to scores, for exporters."""
    import torch

    class Scores(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.model(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)[0]

    return Scores().eval()


def batched_scores(model, queries: list[str], documents: list[str], batch: int, run_batch) -> list[float]:
    """``score_pairs``' order and tokenization, with ``run_batch(numpy inputs) -> scores``."""
    order = sorted(range(len(queries)), key=lambda i: len(queries[i]) + len(documents[i]))
    scores = [0.0] * len(queries)
    for start in range(0, len(order), batch):
        idx = order[start:start + batch]
        inputs = model.encode([queries[i] for i in idx], [documents[i] for i in idx]).inputs
        for i, s in zip(idx, run_batch({name: inputs[name].numpy() for name in INPUTS}).reshape(-1).tolist()):
            scores[i] = s
    return scores


def runtimes(model, example: dict, threads: int, workdir: str) -> tuple[dict, dict]:
    """{name: run_batch} for every installed runtime, and each one's set-up seconds."""
    import torch

    found, setup = {}, {}
    started = time.perf_counter()
    torch.backends.quantized.engine = "x86"
    quantized = torch.ao.quantization.quantize_dynamic(scorer_module(model), {torch.nn.Linear}, dtype=torch.qint8)

    def torch_int8(inputs):
        with torch.inference_mode():
            return quantized(**{k: torch.from_numpy(v) for k, v in inputs.items()}).numpy()
    found["torch int8"], setup["torch int8"] = torch_int8, time.perf_counter() - started

    if importlib.util.find_spec("onnxruntime") and importlib.util.find_spec("onnx"):
        import onnxruntime as ort

        started = time.perf_counter()
        path = os.path.join(workdir, "model.onnx")
        axes = {name: {0: "batch", 1: "tokens"} for name in INPUTS} | {"scores": {0: "batch"}}
        torch.onnx.export(scorer_module(model), tuple(example[name] for name in INPUTS), path, dynamo=False,
                          input_names=list(INPUTS), output_names=["scores"], dynamic_axes=axes, opset_version=17)
        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        plain = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        found["onnxruntime"], setup["onnxruntime"] = (lambda inputs: plain.run(None, inputs)[0]), time.perf_counter() - started
        from onnxruntime.transformers import optimizer

        started = time.perf_counter()
        config = model.encoder.config
        fused_path = os.path.join(workdir, "model.fused.onnx")
        optimizer.optimize_model(path, model_type="bert", num_heads=config.num_attention_heads,
                                 hidden_size=config.hidden_size).save_model_to_file(fused_path)
        fused = ort.InferenceSession(fused_path, options, providers=["CPUExecutionProvider"])
        found["onnxruntime fused"] = lambda inputs: fused.run(None, inputs)[0]
        setup["onnxruntime fused"] = setup["onnxruntime"] + time.perf_counter() - started
    if importlib.util.find_spec("openvino"):
        import openvino as ov

        started = time.perf_counter()
        converted = ov.convert_model(scorer_module(model), example_input={name: example[name] for name in INPUTS})
        converted_s = time.perf_counter() - started
        for name, hint in (("openvino", "f32"), ("openvino bf16", "bf16")):
            started = time.perf_counter()
            compiled = ov.Core().compile_model(converted, "CPU", {"INFERENCE_NUM_THREADS": threads,
                                                                  "INFERENCE_PRECISION_HINT": hint,
                                                                  "PERFORMANCE_HINT": "LATENCY"})
            request = compiled.create_infer_request()
            found[name] = lambda inputs, request=request: next(iter(request.infer(inputs).values()))
            setup[name] = converted_s + time.perf_counter() - started
    return found, setup


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="minilm-l6")
    parser.add_argument("--score-pairs", type=int, default=512)
    parser.add_argument("--batch", type=int, default=64, help="pairs per scoring batch")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--datasets", default="scifact,wikiqa")
    parser.add_argument("--lengths", default="128,256")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "scoring_runtimes.json"))
    args = parser.parse_args()

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import numpy as np
    import torch

    from workloads.kinds.rerank.steps import prepare_trial
    from workloads.models.cross_encoder import CrossEncoder, resolve_model_name, score_pairs

    torch.set_num_threads(args.threads)
    path = resolve_model_name(args.model)
    cpu = torch.device("cpu")
    rows = []
    for dataset in args.datasets.split(","):
        for max_length in (int(n) for n in args.lengths.split(",")):
            prepared = prepare_trial(trial_spec(dataset, max_length, 160, 16, "fp32", args.model))
            queries, documents, _ = training_pairs(prepared.training.training_set)
            n = args.score_pairs
            queries = (queries * (n // len(queries) + 1))[:n]
            documents = (documents * (n // len(documents) + 1))[:n]
            model = CrossEncoder.from_pretrained(path, max_length).eval()
            with tempfile.TemporaryDirectory() as workdir:
                found, setup = runtimes(model, model.encode(queries[:4], documents[:4]).inputs, args.threads, workdir)
                score = {"torch": partial(score_pairs, model, queries, documents, args.batch, cpu, precision="fp32")}
                for name, run_batch in found.items():
                    score[name] = partial(batched_scores, model, queries, documents, args.batch, run_batch)
                for function in score.values():  # one untimed pass each: kernel and memory set-up
                    function()
                speeds, differences = {name: [] for name in score}, {name: 0.0 for name in score}
                for _ in range(args.repeats):
                    reference = None
                    for name, function in score.items():
                        started = time.perf_counter()
                        scores = np.asarray(function())
                        speeds[name].append(n / (time.perf_counter() - started))
                        reference = scores if reference is None else reference
                        differences[name] = max(differences[name], float(np.abs(scores - reference).max()))
            row = {"dataset": dataset, "max_length": max_length, "setup_s": setup,
                   "score_range": [float(reference.min()), float(reference.max())],
                   "pairs_per_s": {name: statistics.median(v) for name, v in speeds.items()},
                   "pairs_per_s_runs": speeds, "max_abs_difference": differences}
            rows.append(row)
            print(f"{dataset} {max_length}: " + ", ".join(f"{k} {v:.1f}" for k, v in row["pairs_per_s"].items()), flush=True)

    names = list(rows[0]["pairs_per_s"])
    print(f"\nscoring pairs/s (median of {args.repeats}; x: / torch; diff: largest |score - torch's|), model {args.model}, "
          f"batch {args.batch}, {args.threads} threads, CPU {platform.processor() or platform.machine()}")
    print(f"{'dataset':<9}{'len':>5}" + "".join(f"{name:>22}" for name in names))
    for r in rows:
        cells = "".join(f"{r['pairs_per_s'][name]:>8.1f} x{r['pairs_per_s'][name] / r['pairs_per_s']['torch']:4.2f}"
                        f" {r['max_abs_difference'][name]:7.1e}" for name in names)
        print(f"{r['dataset']:<9}{r['max_length']:>5}{cells}")
    print("set-up s (export, optimization, compilation): " + ", ".join(
        f"{name} {statistics.mean(r['setup_s'][name] for r in rows):.1f}" for name in names if name != "torch"))
    write_results(args.out, args, torch=torch.__version__, rows=rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
