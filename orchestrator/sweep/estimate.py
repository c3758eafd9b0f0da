"""What a grid costs before it runs: ``orchestrate sweep FILE --dry-run``'s compute estimate.

Every trial's work is counted in query-document pairs: training pairs (``training_data.size``
per epoch, twice that with augmentation: each augmented row adds a triple), validation pairs
(validation queries x ``validation_depth`` per epoch) and, for each cell's winner, test pairs
(test queries x ``test_depth`` per target, zero-shot targets and perturbations included). Pairs
become device-hours through a throughput profile: pairs per second of training and of scoring
for a reference model at a reference length, scaled to each cell's model by its transformer
layers' multiply-adds per token (``layers x (4 h^2 + 2 h i + 2 T h)``: the dense layers and
attention's two matrix products over ``T`` tokens, +11% for BERT-base at 512; the embeddings
left out) and by its ``max_length``. Each profile says whether it was measured or assumed and
how far its rates may be off (``range``: factors on both rates), so the estimate is a point
and a low-high range of device-hours. The estimate is an upper bound in one respect: every
epoch of every trial is counted (pruning and early stopping cut it; replayed on a real grid,
the default Wilcoxon pruner trained 0.66x the compute, ``benchmarks/pruning.py``). It leaves out, and says
so: start-up and node set-up (model loading, Ray, instances booting), preparation (BM25,
tokenization: CPU work before any GPU), checkpoint writes and the supervised selectors'
training.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from orchestrator.sweep.grid import Cell, SweepSpec, sweep_file
from workloads.core.errors import InputError
from workloads.core.paths import data_dir
from workloads.kinds import kind_of
from workloads.models.cross_encoder import resolve_model_name


@dataclass(frozen=True)
class Throughput:
    """Pairs per second of one worker for ``model`` at ``tokens`` tokens per pair."""

    name: str
    model: str
    tokens: int
    train_pairs_per_second: float
    score_pairs_per_second: float
    source: str
    cpus: float | None = None  # CPU profiles: the threads measured (a worker with more CPUs is scaled linearly)
    measured: bool = False  # rates measured on that device (else assumed)
    # (low, high): factors on both rates within which the truth is expected; None: not given
    range: tuple[float, float] | None = None

    @property
    def status(self) -> str:
        return "measured" if self.measured else "assumed"


# Per BERT-base pair at 512 tokens (85M non-embedding parameters N, 12 layers, hidden 768),
# attention's matrix products included: training 6·N·T + 12·l·T²·h = 2.90e11 FLOP, scoring
# 2·N·T + 4·l·T²·h = 9.7e10 FLOP.
# h100 is measured: the project's own loop (epoch 2 of RerankEpochs timed) and scorer on one
# H100 80GB SXM at commit 617b804: 285 training pairs/s (10.5% of the 790 TFLOP/s the GPU ran a
# large bf16 matrix product at: the host, not the GPU, sets the pace) and 1,332 scoring pairs/s
# from stored token ids. Its range: a second H100 machine ran the same loop 1.13x faster, and
# speed-ups of the loop (fixed shapes, less host work per step) will raise it: measure again.
# The others are assumptions: a dense bf16 peak times a model-FLOP utilisation (MFU) near
# what the eager loop reached in GPU time on the H100 (~26%), with a range that spans the
# peak's and the utilisation's uncertainty. The A10G's peak is taken as 90 TFLOP/s within
# 70-125: 125 is the A10's datasheet figure, and the A10G runs below it. On a host-bound device
# (the H100 today) models much smaller than the reference run slower than the FLOP scaling
# says (MiniLM-L6 at 512: 471 pairs/s measured, 2,070 scaled); BERT-base, RoBERTa-base and
# DistilBERT (536 measured, 570 scaled) are close.
THROUGHPUTS = {
    "cpu-2core": Throughput(
        "cpu-2core", "minilm-l6", 128, 12.8, 52.3,
        "measured by benchmarks/throughput.py on a 2-core AMD EPYC with AVX512-BF16, no AMX (bf16 autocast, 1 thread, "
        "SciFact pairs at 128 tokens)", cpus=1, measured=True),
    "a10g": Throughput("a10g", "bert-base-uncased", 512, 80.0, 280.0,
                       "assumption: A10G (AWS g5), dense bf16 peak 90 TFLOP/s (70-125) at ~26% (train) / ~30% (score) MFU; "
                       "range: 70 TFLOP/s at 20% to 125 at 35%", range=(0.6, 1.9)),
    "a100": Throughput("a100", "bert-base-uncased", 512, 250.0, 1000.0,
                       "assumption: A100, 312 TFLOP/s dense bf16 peak at ~25% (train) / ~30% (score) MFU, below the "
                       "measured H100's 285 / 1,332", range=(0.6, 1.15)),
    "h100": Throughput("h100", "bert-base-uncased", 512, 285.0, 1332.0,
                       "measured at 617b804 on one H100 80GB SXM: the project's training loop (epoch 2, BERT-base, 512 "
                       "tokens, batch 16, bf16) and scorer (batch 256, stored token ids)", measured=True, range=(0.9, 1.15)),
}

# (layers, hidden, intermediate) of models whose config may not be on this machine
KNOWN_SHAPES = {
    "bert-base-uncased": (12, 768, 3072), "bert-base-cased": (12, 768, 3072), "roberta-base": (12, 768, 3072),
    "distilbert-base-uncased": (6, 768, 3072), "bert-large-uncased": (24, 1024, 4096), "minilm-l6": (6, 384, 1536),
    "electra-base-discriminator": (12, 768, 3072), "microsoft/MiniLM-L12-H384-uncased": (12, 384, 1536),
}

# Judged queries of splits that are not local (for local BEIR data the qrels are counted)
KNOWN_JUDGED_QUERIES = {
    ("msmarco-document/trec-dl-2019/judged", "test"): 43, ("msmarco-document/trec-dl-2019", "test"): 43,
    ("msmarco-passage/trec-dl-2019/judged", "test"): 43, ("beir/scifact", "test"): 300, ("beir/fiqa", "test"): 648,
    ("beir/dbpedia-entity", "test"): 400, ("beir/trec-covid", "test"): 50, ("beir/nfcorpus", "test"): 323,
    ("disks45/nocr/trec-robust-2004", "test"): 249, ("wikiqa", "test"): 243,
    ("beir/scifact", "train"): 809,  # an EAR grid trains on every training query
}


@cache  # once per model, not per cell (doc19: 255 cells, 3 models)
def model_shape(name: str) -> tuple[tuple[int, int, int], str]:
    """(layers, hidden, intermediate) of a model, and where it comes from: its config when it is
    local or in the Hugging Face cache, else the table above, else BERT-base's (said so)."""
    config = None
    try:
        path = resolve_model_name(name)
    except Exception:  # an alias whose package is missing: judged by its name below
        path = name
    if (Path(path) / "config.json").exists():
        config = Path(path) / "config.json"
    else:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(path, "config.json")
        config = Path(cached) if isinstance(cached, str) else None
    if config is not None:
        c = json.loads(config.read_text())
        layers = c.get("num_hidden_layers", c.get("n_layers"))
        hidden = c.get("hidden_size", c.get("dim"))
        inner = c.get("intermediate_size", c.get("hidden_dim", 4 * (hidden or 0)))
        if layers and hidden:
            return (layers, hidden, inner), "its config"
    if name in KNOWN_SHAPES:
        return KNOWN_SHAPES[name], "a known shape"
    return KNOWN_SHAPES["bert-base-uncased"], "assumed BERT-base's shape (no config here)"


def _flops_per_token(shape: tuple[int, int, int], tokens: int) -> float:
    """Multiply-adds per token of a model's transformer layers over ``tokens`` tokens: the dense
    layers (Q, K, V, output: 4 h², the feed-forward: 2 h i) and attention's two matrix products
    (scores Q·Kᵀ and their weighted sum of V: T h each)."""
    layers, hidden, inner = shape
    return layers * (4 * hidden * hidden + 2 * hidden * inner + 2 * tokens * hidden)


@cache  # once per split, not per cell and target (doc19: 255 cells x 7 targets)
def judged_queries(collection: str, split: str) -> int | None:
    """Judged queries of a split: counted in local BEIR qrels, else the table, else None."""
    root = data_dir()
    if root is not None:
        qrels = root / collection.removeprefix("beir/") / "qrels" / f"{split}.tsv"
        if qrels.is_file():
            with qrels.open() as lines:
                next(lines, None)  # the header
                return len({line.split("\t", 1)[0] for line in lines if line.strip()})
    return KNOWN_JUDGED_QUERIES.get((collection, split))


def load_throughputs(path: Path | None) -> dict[str, Throughput]:
    """The built-in profiles, and those of a ``--throughput`` YAML file (name -> the fields of
    :class:`Throughput` but ``name``), which add to or replace them."""
    profiles = dict(THROUGHPUTS)
    if path is None:
        return profiles
    try:
        loaded = yaml.safe_load(Path(path).read_text()) or {}
        for name, fields in loaded.items():
            profiles[name] = Throughput(name=name, **{"source": f"{path}", **checked_profile(path, name, fields)})
    except (OSError, yaml.YAMLError, TypeError, AttributeError) as exc:
        raise InputError(str(path), f"not a throughput file (name: {{model, tokens, train_pairs_per_second, "
                                    f"score_pairs_per_second[, source, cpus]}}): {str(exc).splitlines()[0]}") from None
    return profiles


class _ProfileFields(BaseModel):
    """What a ``--throughput`` profile's numbers must be for the estimate to mean anything:
    rates and lengths above zero and finite (a rate divides the pairs)."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)  # Throughput itself refuses a key it has no field for

    model: str = Field(min_length=1)
    tokens: int = Field(gt=0)
    train_pairs_per_second: float = Field(gt=0)
    score_pairs_per_second: float = Field(gt=0)
    cpus: float | None = Field(default=None, gt=0)
    measured: bool = False
    range: tuple[float, float] | None = None  # factors on both rates: [low, high], low <= 1 <= high

    @field_validator("range")
    @classmethod
    def _around_the_rates(cls, value):
        if value is not None and not 0 < value[0] <= 1 <= value[1]:
            raise ValueError("must be [low, high] factors on the rates with 0 < low <= 1 <= high")
        return value


def checked_profile(path: Path, name: object, fields: object) -> dict:
    """The fields of profile ``name`` of a ``--throughput`` file, validated (one line naming the
    file, the profile and the field otherwise); its model must have a shape known here (its
    config, or a known one), since every cell is scaled against it."""
    if not isinstance(fields, dict):
        raise InputError(str(path), f"profile {name!r}: not a mapping of model, tokens, train_pairs_per_second, "
                                    "score_pairs_per_second")
    try:
        checked = _ProfileFields.model_validate(fields).model_dump(exclude_unset=True)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(p) for p in error["loc"])
        if error["type"] == "missing":
            raise InputError(str(path), f"not a throughput file (name: {{model, tokens, train_pairs_per_second, "
                                        f"score_pairs_per_second[, source, cpus]}}): profile {name!r} has no {where}") from None
        raise InputError(str(path), f"profile {name!r}: {where}: {error['msg']} (got {error.get('input')!r})") from None
    _, shape_source = model_shape(checked["model"])
    if shape_source.startswith("assumed"):
        raise InputError(str(path), f"profile {name!r}: model {checked['model']!r} is unknown here (no config, not one of "
                                    f"{', '.join(sorted(KNOWN_SHAPES))}): every cell is scaled against its shape")
    return {**fields, **checked}


@dataclass
class CellEstimate:
    key: str
    axes: dict[str, str]
    trials: int
    train_pairs: int | None       # per trial, every epoch; None: size full (unknown before preparing)
    validation_pairs: int | None  # per trial, every epoch; None: a validation split of unknown size
    test_pairs: int | None        # the winner's, every target; None where a test set's size is unknown here
    train_hours: float
    evaluation_hours: float  # validation and test

    @property
    def hours(self) -> float:
        return self.train_hours + self.evaluation_hours


def _cell_pairs(cell: Cell, sweep: SweepSpec) -> tuple[int | None, int | None, int | None]:
    """(training pairs of one trial, its validation pairs, the winner's test pairs), as the cell's
    kind counts them (``TrialKind.cell_pairs``); None where a size is not known here (``size:
    full``, a validation split of unknown size, a test set)."""
    return kind_of(cell.spec).cell_pairs(cell.spec, sweep, judged_queries)


def hours_range(hours: float, profile: Throughput) -> tuple[float, float]:
    """(low, high) device-hours: rates ``range[1]`` times the profile's take the fewest hours."""
    low, high = profile.range or (1.0, 1.0)
    return hours / high, hours / low


def estimate(sweep: SweepSpec, profile: Throughput, trials_left: dict[str, int] | None = None,
             price_per_hour: float | None = None, compared: dict[str, Throughput] | None = None) -> dict:
    """The grid's compute on ``profile``: per cell and in all, device-hours (one worker's device
    each: a trial of ``workers`` workers costs that many times its wall time), with the low-high
    range of the profile's rates. ``trials_left``: the trials each cell still has to run
    (default: all of them). ``compared``: profiles whose device-hours are given beside it (GPU
    profiles only: a CPU profile's rate also scales with each worker's CPUs)."""
    reference = _flops_per_token(model_shape(profile.model)[0], profile.tokens) * profile.tokens
    cells, shapes, unknown = [], {}, set()
    work = {"train": 0.0, "score": 0.0}  # pairs x multiply-adds per pair, for the compared profiles
    for cell in sweep.cells:
        if cell.spec is None:
            continue
        if kind_of(cell.spec).cell_pairs is None:  # a kind without a cost model (TrialKind.cell_pairs): not counted
            unknown.add(cell.key)
            continue
        spec = cell.spec
        shape, shape_source = model_shape(spec.model.name)
        shapes[spec.model.name] = shape_source
        scale = _flops_per_token(shape, spec.model.max_length) * spec.model.max_length / reference
        if profile.cpus:  # a CPU profile: more threads per worker, proportionally faster (roughly)
            scale *= profile.cpus / spec.resources.cpus_per_worker
        train, validation, test = _cell_pairs(cell, sweep)
        trials = sweep.search.trials_per_cell if trials_left is None else trials_left.get(cell.key, 0)
        if None in (train, validation, test):
            unknown.add(cell.key)
        tested = (test or 0) if trials else 0  # a cell with trials left is tested (again) at its end
        workers = spec.resources.workers
        work["train"] += trials * (train or 0) * scale * reference
        work["score"] += (trials * (validation or 0) * workers + tested) * scale * reference
        cells.append(CellEstimate(
            cell.key, cell.axes, trials, train, validation, test,
            # data parallel: the workers share the pairs, so the device time is the pairs' (ideal scaling)
            train_hours=trials * (train or 0) * scale / profile.train_pairs_per_second / 3600,
            # rank 0 validates while the other workers wait and hold their devices; a test is one worker's task
            evaluation_hours=(trials * (validation or 0) * workers + tested) * scale / profile.score_pairs_per_second / 3600))
    hours = sum(c.hours for c in cells)
    low, high = hours_range(hours, profile)
    profiles = []
    for other in (compared or {}).values():
        if other.cpus or profile.cpus:  # CPU rates scale with each cell's CPUs, not by the work alone
            continue
        own = _flops_per_token(model_shape(other.model)[0], other.tokens) * other.tokens
        other_hours = (work["train"] / other.train_pairs_per_second + work["score"] / other.score_pairs_per_second) / own / 3600
        profiles.append({"name": other.name, "status": other.status, "range": other.range, "device_hours": other_hours,
                         "device_hours_range": list(hours_range(other_hours, other))})
    required = {kind_of(r).key(r): kind_of(r).name for c in sweep.cells if c.spec is not None
                for r in kind_of(c.spec).requires(c.spec)}
    kinds = ", ".join(f"{n} {kind}{'s' if n > 1 else ''}" for kind, n in sorted(Counter(required.values()).items()))
    return {
        "profile": {**asdict(profile), "status": profile.status},
        "device_hours": hours,
        "device_hours_range": [low, high],
        "train_hours": sum(c.train_hours for c in cells),
        "evaluation_hours": sum(c.evaluation_hours for c in cells),
        "price_per_hour": price_per_hour,
        "cost": hours * price_per_hour if price_per_hour is not None else None,
        "cost_range": [low * price_per_hour, high * price_per_hour] if price_per_hour is not None else None,
        "trials": sum(c.trials for c in cells),
        "profiles": profiles,
        "model_shapes": shapes,
        "cells_with_unknown_sizes": sorted(unknown),
        "cells": [{**asdict(c), "hours": c.hours} for c in cells],
        "assumptions": [
            "every epoch of every trial runs (pruning and early stopping only lower it)",
            "throughput scales with each model's multiply-adds per token (attention's included) and with max_length",
            "the range is the profile's: its rates' uncertainty, not the grid's",
            "not counted: start-up and node set-up (instances booting, Ray, model loading), preparation (CPU), "
            "checkpoint writes" + (f", the training of the trials the cells require ({kinds})" if kinds else ""),
        ],
    }


def default_profile(sweep: SweepSpec) -> str:
    """a10g (``cluster.yaml``'s GPU) for a grid that asks for GPUs, else the CPU profile."""
    cells = [c for c in sweep.cells if c.spec is not None]
    return "a10g" if any(c.spec.resources.use_gpu is True for c in cells) else "cpu-2core"


def choose_profile(sweep: SweepSpec, name: str | None, path: Path | None) -> Throughput:
    profiles = load_throughputs(path)
    name = name or default_profile(sweep)
    if name not in profiles:
        raise InputError(sweep_file(sweep) or sweep.name, f"--device {name}: no such throughput profile (known: "
                                                          f"{', '.join(sorted(profiles))}; add one with --throughput FILE)")
    return profiles[name]
