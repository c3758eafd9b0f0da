"""Training and scoring on a GPU: our loop's step and scorer against sentence-transformers'
``CrossEncoderTrainer`` and ``CrossEncoder.predict``, side by side in one run, with MFU, the time of
each phase of our step, kernel launches per step, and a ``--throughput`` profile for the cost
estimate (``orchestrate sweep FILE --dry-run --throughput PROFILE --device NAME``).

Runs where the project is not installed (a GPU image on another Python): from a source copy on
``PYTHONPATH`` with only torch, transformers, pyarrow and numpy; sentence-transformers is used
when importable and skipped otherwise. It imports no module that needs pydantic, ir_measures,
Ray or MLflow: the step below is the loop's (``workloads.training.step.accumulated_step`` with
pointwise BCE, ``workloads.kinds.rerank.train.prefetched``), written out so each phase can be timed.

Models are randomly initialised from their configs (throughput needs no weights, nothing is
downloaded): BERT-base (12/768/12/3072), DistilBERT (6/768/12/3072), MiniLM-L6 (6/384/12/1536),
with a WordPiece tokenizer built here (``--tokenizer DIR`` takes a real one). Every pair fills
``max_length`` (FirstP documents, as doc19's): queries of a few words, documents longer than the
length. Our side reads stored token ids, as every trial does.

Per (model, length, batch): for each variant of ours (``eager``: the loop as it runs today, a
host read of the loss per step; ``fixed``: the encoder compiled at fixed shapes,
``optimization.compile: {dynamic: false}``; ``graphs``: with CUDA graphs, ``{mode:
reduce-overhead, dynamic: false}``; ``graphs-nosync``: the same with the loss read once at the
end) pairs/s over ``--steps`` steps after ``--warmup`` (compiling happens there), MFU, then
``--phase-steps`` steps with a synchronisation after each phase (input, forward, backward, clip,
optimizer, sync: ms each), then kernel launches per step from torch.profiler (on CPU: torch
operator calls). sentence-transformers: its trainer (bf16 on GPU) over the same pairs, timed
around ``train()`` after one warm-up run. Scoring: ``score_pairs`` at ``--score-batch`` and
``CrossEncoder.predict``.

FLOPs per pair: training 6·N·T + 12·l·T²·h, scoring 2·N·T + 4·l·T²·h (N non-embedding
parameters, T tokens, l layers, h hidden). MFU's denominator: ``--peak-tflops``, else a large
matrix product measured here in the run's precision.

    PYTHONPATH=/path/to/source python benchmarks/gpu_throughput.py --device cuda \\
        [--models bert-base,distilbert,minilm-l6] [--lengths 128,512] [--batches 16,64] \\
        [--variants eager,fixed,graphs,graphs-nosync] [--steps 30] [--peak-tflops 989] \\
        [--out benchmarks/results/gpu_throughput.json] [--throughput-out benchmarks/results/gpu_throughput.profiles.json]
    python benchmarks/gpu_throughput.py --smoke --device cpu   # tiny models, a few steps: checks the script runs
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from _results import write_results  # noqa: E402

# (kind, layers, hidden, heads, intermediate); the names are the cost estimate's (KNOWN_SHAPES)
MODELS = {
    "bert-base": ("bert", 12, 768, 12, 3072, "bert-base-uncased"),
    "distilbert": ("distilbert", 6, 768, 12, 3072, "distilbert-base-uncased"),
    "minilm-l6": ("bert", 6, 384, 12, 1536, "minilm-l6"),
}
SMOKE_SHAPE = (2, 32, 2, 64)  # layers, hidden, heads, intermediate
VARIANTS = ("eager", "fixed", "graphs", "graphs-nosync")
PHASES = ("input", "forward", "backward", "clip", "optimizer", "sync")
WORDS = ("cell protein gene expression cancer patient study risk trial dose effect level response tumor blood "
         "drug therapy disease clinical mouse human model data analysis result method sample group rate increase").split()


def build_tokenizer(directory: Path):
    """A WordPiece (BERT) tokenizer over ``WORDS``, letters and digits: real special tokens and
    pair encoding, no download."""
    from transformers import BertTokenizerFast

    vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, *"abcdefghijklmnopqrstuvwxyz0123456789"]
    vocabulary += [f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz0123456789"]
    (directory / "vocab.txt").write_text("\n".join(vocabulary) + "\n")
    return BertTokenizerFast(vocab_file=str(directory / "vocab.txt"))


def build_model(name: str, max_length: int, tokenizer, smoke: bool, directory: Path):
    """Our CrossEncoder over a random encoder of ``name``'s config, also saved to ``directory``
    (for sentence-transformers)."""
    import torch
    from transformers import BertConfig, BertModel, DistilBertConfig, DistilBertModel

    from workloads.models.cross_encoder import CrossEncoder

    kind, layers, hidden, heads, intermediate, _ = MODELS[name]
    if smoke:
        layers, hidden, heads, intermediate = SMOKE_SHAPE
    torch.manual_seed(0)
    positions = max(512, max_length)
    if kind == "distilbert":
        config = DistilBertConfig(vocab_size=tokenizer.vocab_size, n_layers=layers, dim=hidden, n_heads=heads,
                                  hidden_dim=intermediate, max_position_embeddings=positions)
        encoder = DistilBertModel(config)
    else:
        config = BertConfig(vocab_size=tokenizer.vocab_size, num_hidden_layers=layers, hidden_size=hidden,
                            num_attention_heads=heads, intermediate_size=intermediate, max_position_embeddings=positions)
        encoder = BertModel(config, add_pooling_layer=False)
    encoder.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return CrossEncoder(encoder, tokenizer, max_length), (layers, hidden)


def make_pairs(count: int, max_length: int, seed: int = 13) -> tuple[list[str], list[str], list[float]]:
    """Queries of 4-10 words, documents of more words than ``max_length`` tokens (cut, FirstP),
    labels alternating 1, 0."""
    rng = random.Random(seed)
    queries = [" ".join(rng.choices(WORDS, k=rng.randint(4, 10))) + f" {i}" for i in range(count)]
    documents = [" ".join(rng.choices(WORDS, k=max_length + 32)) for _ in range(count)]
    return queries, documents, [float(i % 2 == 0) for i in range(count)]


def non_embedding_parameters(model) -> int:
    embeddings = getattr(model.encoder, "embeddings", None) or model.encoder.get_input_embeddings()
    excluded = {id(p) for p in embeddings.parameters()}
    return sum(p.numel() for p in model.parameters() if id(p) not in excluded)


def flops_per_pair(parameters: int, tokens: int, layers: int, hidden: int, training: bool) -> float:
    if training:
        return 6 * parameters * tokens + 12 * layers * tokens ** 2 * hidden
    return 2 * parameters * tokens + 4 * layers * tokens ** 2 * hidden


def peak_flops(device, dtype) -> float:
    """FLOP/s of a large square matrix product on ``device`` in ``dtype`` (best of 5)."""
    import torch

    size = 8192 if device.type == "cuda" else 1024
    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)
    synchronize(device)
    best = float("inf")
    for _ in range(6):
        started = time.perf_counter()
        for _ in range(4):
            torch.mm(a, b)
        synchronize(device)
        best = min(best, time.perf_counter() - started)
    return 4 * 2 * size ** 3 / best


def synchronize(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def autocast(device, precision: str):
    import torch

    from workloads.models.cross_encoder import autocast_dtype

    dtype = autocast_dtype(device, precision)
    return torch.autocast(device.type, dtype=dtype, enabled=dtype is not None)


class OurLoop:
    """The loop's training step with pointwise BCE (``accumulated_step``, one batch per step) and
    its prefetch thread (``prefetched``: the next batch padded from stored ids in a thread,
    pinned, copied without blocking)."""

    def __init__(self, model, pairs, batch: int, device, precision: str, variant: str) -> None:
        import torch

        from workloads.models.cross_encoder import compile_encoder

        self.model, self.batch, self.device, self.precision = model.to(device), batch, device, precision
        if variant != "eager":
            compile_encoder(self.model, mode="reduce-overhead" if variant.startswith("graphs") else "default", dynamic=False)
        self.read_every_step = variant != "graphs-nosync"
        self.queries, self.documents, labels = pairs
        self.labels = torch.tensor(labels)
        self.stored = self.model.tokenized(self.queries, self.documents)
        self.parameters = list(self.model.parameters())
        fused = device.type in ("cuda", "cpu")
        self.optimizer = torch.optim.AdamW(self.parameters, lr=2e-5, fused=fused)
        self.model.train()

    def plan(self, steps: int) -> list[list[int]]:
        order = list(range(len(self.queries)))
        random.Random(13).shuffle(order)
        per_epoch = len(order) // self.batch
        return [order[(s % per_epoch) * self.batch:(s % per_epoch + 1) * self.batch] for s in range(steps)]

    def prepare(self, indices: list[int]):
        pairs = self.model.encode([self.queries[i] for i in indices], [self.documents[i] for i in indices], self.stored)
        labels = self.labels[indices]
        if self.device.type == "cuda":
            return pairs.pin_memory(), labels.pin_memory()
        return pairs, labels

    def run(self, steps: int, phases: dict[str, list[float]] | None = None) -> float:
        """Seconds for ``steps`` steps (a final synchronisation included); with ``phases``, each
        phase synchronised and timed (ms appended per phase)."""
        import torch

        device, pin = self.device, self.device.type == "cuda"
        plan = self.plan(steps)
        total = torch.zeros((), device=device)
        clock = time.perf_counter

        def mark(name: str, since: float) -> float:
            if phases is None:
                return since
            synchronize(device)
            now = clock()
            phases.setdefault(name, []).append(1000 * (now - since))
            return now

        synchronize(device)
        started = clock()
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="prefetch") as pool:
            upcoming = pool.submit(self.prepare, plan[0])
            for step in range(steps):
                at = clock()
                pairs, labels = upcoming.result()
                if step + 1 < steps:
                    upcoming = pool.submit(self.prepare, plan[step + 1])
                inputs = {k: v.to(device, non_blocking=pin) for k, v in pairs.inputs.items()}
                labels = labels.to(device, non_blocking=pin)
                at = mark("input", at)
                self.optimizer.zero_grad(set_to_none=True)
                with autocast(device, self.precision):
                    scores, _ = self.model(**inputs)
                loss = torch.nn.functional.binary_cross_entropy_with_logits(scores.float(), labels)
                at = mark("forward", at)
                loss.backward()
                at = mark("backward", at)
                torch.nn.utils.clip_grad_norm_(self.parameters, 1.0)
                at = mark("clip", at)
                self.optimizer.step()
                at = mark("optimizer", at)
                if self.read_every_step:
                    float(loss.detach())  # the loop's per-step host read (total_loss += float(...))
                else:
                    total += loss.detach()
                mark("sync", at)
        float(total)
        synchronize(device)
        return clock() - started

    def launches_per_step(self, steps: int) -> tuple[float, str]:
        """Kernel launches per step on a GPU (torch.profiler's device kernels), else torch
        operator calls per step."""
        import torch
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device.type == "cuda" else [])
        with profile(activities=activities) as prof:
            self.run(steps)
        events = prof.events()
        if self.device.type == "cuda":
            kernels = sum(1 for e in events if e.device_type == torch.autograd.DeviceType.CUDA)
            return kernels / steps, "cuda kernels"
        return sum(1 for e in events if e.name.startswith("aten::")) / steps, "torch operators"


def ours_scoring(model, pairs, batch: int, device, precision: str) -> float:
    from workloads.models.cross_encoder import score_pairs

    queries, documents, _ = pairs
    stored = model.tokenized(queries, documents)
    score_pairs(model, queries[:batch], documents[:batch], batch, device, precision=precision, tokenized=stored)  # warm-up
    synchronize(device)
    started = time.perf_counter()
    score_pairs(model, queries, documents, batch, device, precision=precision, tokenized=stored)
    return len(queries) / (time.perf_counter() - started)


def sentence_transformers_available() -> bool:
    try:
        import accelerate  # noqa: F401  (its trainer needs it)
        import datasets  # noqa: F401
        import sentence_transformers  # noqa: F401
    except ImportError:
        return False
    return True


def st_training(path: Path, max_length: int, pairs, batch: int, device, pairs_timed: int) -> float:
    from datasets import Dataset
    from sentence_transformers.cross_encoder import CrossEncoder, CrossEncoderTrainer, CrossEncoderTrainingArguments
    from sentence_transformers.cross_encoder.losses import BinaryCrossEntropyLoss

    queries, documents, labels = pairs
    model = CrossEncoder(str(path), num_labels=1, max_length=max_length, device=device.type)

    def train(count: int) -> float:
        usable = count // batch * batch
        dataset = Dataset.from_dict({"query": queries[:usable], "document": documents[:usable], "label": labels[:usable]})
        with tempfile.TemporaryDirectory() as out:
            args = CrossEncoderTrainingArguments(
                output_dir=out, per_device_train_batch_size=batch, num_train_epochs=1, learning_rate=2e-5,
                bf16=device.type == "cuda", use_cpu=device.type == "cpu", save_strategy="no", report_to="none",
                logging_steps=10_000, disable_tqdm=True, seed=13, dataloader_drop_last=True)
            trainer = CrossEncoderTrainer(model=model, args=args, train_dataset=dataset, loss=BinaryCrossEntropyLoss(model))
            synchronize(device)
            started = time.perf_counter()
            trainer.train()
            synchronize(device)
            return usable / (time.perf_counter() - started)

    train(min(len(queries), 4 * batch))  # warm-up: kernels, allocator
    return train(pairs_timed)


def st_scoring(path: Path, max_length: int, pairs, batch: int, device) -> float:
    from sentence_transformers.cross_encoder import CrossEncoder

    queries, documents, _ = pairs
    model = CrossEncoder(str(path), num_labels=1, max_length=max_length, device=device.type)
    model.predict(list(zip(queries[:batch], documents[:batch])), batch_size=batch)
    synchronize(device)
    started = time.perf_counter()
    model.predict(list(zip(queries, documents)), batch_size=batch)
    synchronize(device)
    return len(queries) / (time.perf_counter() - started)


def measure(name: str, length: int, batch: int, args, device, tokenizer, peak: float, work: Path) -> dict:
    import torch

    directory = work / f"{name}-{length}"
    directory.mkdir(parents=True, exist_ok=True)
    base, (layers, hidden) = build_model(name, length, tokenizer, args.smoke, directory)
    parameters = non_embedding_parameters(base)
    steps = args.steps
    count = max(batch * (steps + args.warmup), args.score_pairs)
    pairs = make_pairs(count, length)
    train_flops = flops_per_pair(parameters, length, layers, hidden, training=True)
    score_flops = flops_per_pair(parameters, length, layers, hidden, training=False)
    row = {"model": name, "estimate_model": MODELS[name][5], "tokens": length, "batch": batch,
           "non_embedding_parameters": parameters, "ours": {}}
    for variant in args.variants:
        if variant.startswith("graphs") and device.type != "cuda":
            row["ours"][variant] = {"skipped": "CUDA graphs need a GPU"}
            continue
        loop = OurLoop(copy.deepcopy(base), pairs, batch, device, args.precision, variant)
        filled = loop.model.encode(pairs[0][:batch], pairs[1][:batch], loop.stored).inputs["input_ids"].shape[1]
        compile_started = time.perf_counter()
        loop.run(args.warmup)
        warmup_s = time.perf_counter() - compile_started
        seconds = loop.run(steps)
        pairs_per_s = steps * batch / seconds
        phases: dict[str, list[float]] = {}
        loop.run(args.phase_steps, phases)
        launches, unit = loop.launches_per_step(args.profile_steps)
        row["ours"][variant] = {
            "pairs_per_s": pairs_per_s, "ms_per_step": 1000 * seconds / steps, "mfu": pairs_per_s * train_flops / peak,
            "warmup_s": warmup_s, "padded_length": int(filled),
            "phase_ms": {p: statistics.median(phases[p]) for p in PHASES if p in phases},
            "launches_per_step": launches, "launch_unit": unit,
            "scoring_pairs_per_s": ours_scoring(loop.model, [p[:args.score_pairs] for p in pairs], args.score_batch, device,
                                                args.precision),
        }
        row["ours"][variant]["scoring_mfu"] = row["ours"][variant]["scoring_pairs_per_s"] * score_flops / peak
        del loop
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if args.no_st or not sentence_transformers_available():
        row["sentence_transformers"] = {"skipped": "--no-st" if args.no_st else "sentence-transformers, datasets or "
                                                                                "accelerate not importable"}
        return row
    try:
        st_train = st_training(directory, length, pairs, batch, device, batch * steps)
        st_score = st_scoring(directory, length, [p[:args.score_pairs] for p in pairs], args.score_batch, device)
    except Exception as exc:  # noqa: BLE001 - the other side's failure must not lose our measurements
        row["sentence_transformers"] = {"skipped": f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
        return row
    row["sentence_transformers"] = {"pairs_per_s": st_train, "mfu": st_train * train_flops / peak,
                                    "scoring_pairs_per_s": st_score, "scoring_mfu": st_score * score_flops / peak}
    return row


def profiles(rows: list[dict], args, device_name: str) -> dict:
    """``--throughput`` profiles (orchestrator/sweep/estimate.py's format): one per model, length,
    batch and variant that ran."""
    out = {}
    for row in rows:
        for variant, result in row["ours"].items():
            if "pairs_per_s" not in result:
                continue
            name = f"{args.profile_prefix}-{row['model']}-{row['tokens']}-b{row['batch']}-{variant}"
            source = (f"benchmarks/gpu_throughput.py on {device_name}: our step ({variant}, {args.precision}, batch "
                      f"{row['batch']}, pairs filling {row['tokens']} tokens, random weights) and scorer (batch "
                      f"{args.score_batch}, stored ids)")
            if args.smoke:
                source = "smoke run with tiny models: not a measurement; " + source
            out[name] = {"model": row["estimate_model"], "tokens": row["tokens"],
                         "train_pairs_per_second": round(result["pairs_per_s"], 3),
                         "score_pairs_per_second": round(result["scoring_pairs_per_s"], 3),
                         "source": source, "measured": not args.smoke}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--models", default="bert-base,distilbert,minilm-l6")
    parser.add_argument("--lengths", default="128,512")
    parser.add_argument("--batches", default="16,64")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--precision", default="auto", choices=("auto", "fp32", "bf16", "fp16"))
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first (compiling happens there)")
    parser.add_argument("--phase-steps", type=int, default=10)
    parser.add_argument("--profile-steps", type=int, default=5)
    parser.add_argument("--score-batch", type=int, default=256)
    parser.add_argument("--score-pairs", type=int, default=1024)
    parser.add_argument("--peak-tflops", type=float, help="MFU's denominator (H100 SXM dense bf16: 989); else measured")
    parser.add_argument("--no-st", action="store_true", help="leave sentence-transformers out")
    parser.add_argument("--tokenizer", help="a local tokenizer directory instead of the built-in WordPiece vocabulary")
    parser.add_argument("--profile-prefix", default=None, help="names of the written profiles (default: the device)")
    parser.add_argument("--smoke", action="store_true", help="tiny models, one length and batch, a few steps")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "gpu_throughput.json"))
    parser.add_argument("--throughput-out", default=None, help="default: --out with .profiles.json")
    args = parser.parse_args(argv)
    if args.smoke:  # tiny sizes where not given
        smoke = {"models": "bert-base,distilbert", "lengths": "32", "batches": "4", "variants": "eager", "steps": 3,
                 "warmup": 1, "phase_steps": 2, "profile_steps": 1, "score_batch": 8, "score_pairs": 16}
        for key, value in smoke.items():
            if getattr(args, key) == parser.get_default(key):
                setattr(args, key, value)
    args.models = args.models.split(",")
    args.lengths = [int(x) for x in args.lengths.split(",")]
    args.batches = [int(x) for x in args.batches.split(",")]
    args.variants = args.variants.split(",")
    unknown = [m for m in args.models if m not in MODELS] + [v for v in args.variants if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown model or variant: {', '.join(unknown)} (models: {', '.join(MODELS)}; variants: "
                     f"{', '.join(VARIANTS)})")

    import torch

    from workloads.models.cross_encoder import autocast_dtype

    device = torch.device(args.device)
    work = Path(tempfile.mkdtemp(prefix="gpu-throughput-"))
    os.environ["ORCHESTRATE_CACHE_DIR"] = str(work / "cache")  # stored ids of this run only
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.tokenizer:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    else:
        tokenizer = build_tokenizer(work)
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else (platform.processor() or "cpu")
    args.profile_prefix = args.profile_prefix or ("smoke" if args.smoke else device_name.split()[-1].lower())
    dtype = autocast_dtype(device, args.precision) or torch.float32
    peak = 1e12 * args.peak_tflops if args.peak_tflops else peak_flops(device, dtype)
    rows = []
    for name in args.models:
        for length in args.lengths:
            for batch in args.batches:
                row = measure(name, length, batch, args, device, tokenizer, peak, work)
                rows.append(row)
                for variant, result in row["ours"].items():
                    if "pairs_per_s" in result:
                        print(f"{name:10} {length:4} {batch:3} {variant:14} {result['pairs_per_s']:9.1f} pairs/s "
                              f"MFU {100 * result['mfu']:5.1f}% {result['ms_per_step']:7.1f} ms/step "
                              f"{result['launches_per_step']:7.0f} {result['launch_unit']}/step  scoring "
                              f"{result['scoring_pairs_per_s']:9.1f} pairs/s", flush=True)
                st = row["sentence_transformers"]
                print(f"{name:10} {length:4} {batch:3} {'ST':14} " + (f"{st['pairs_per_s']:9.1f} pairs/s MFU "
                      f"{100 * st['mfu']:5.1f}%  scoring {st['scoring_pairs_per_s']:9.1f} pairs/s" if "pairs_per_s" in st
                      else st["skipped"]), flush=True)
    throughput_out = Path(args.throughput_out or str(Path(args.out).with_suffix("")) + ".profiles.json")
    throughput_out.parent.mkdir(parents=True, exist_ok=True)
    throughput_out.write_text(json.dumps(profiles(rows, args, device_name), indent=2))
    print(f"written: {throughput_out} (orchestrate sweep FILE --dry-run --throughput {throughput_out} --device NAME)")
    versions = {"python": platform.python_version(), "torch": torch.__version__}
    with contextlib.suppress(ImportError):
        import transformers

        versions["transformers"] = transformers.__version__
    write_results(args.out, args, device=device_name, peak_flops=peak, precision=str(dtype), versions=versions, rows=rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
