"""What a grid costs before it runs: ``orchestrate sweep FILE --dry-run``'s compute estimate.

Every trial's work is counted in query-document pairs: training pairs (``training_data.size``
per epoch, twice that with augmentation: each augmented row adds a triple), validation pairs
(validation queries x ``validation_depth`` per epoch) and, for each cell's winner, test pairs
(test queries x ``test_depth`` per target, zero-shot targets and perturbations included). Pairs
become device-hours through a throughput profile: pairs per second of training and of scoring
for a reference model at a reference length, scaled to each cell's model by its transformer
layers' multiply-adds per token (``layers x (4 h^2 + 2 h i)``: attention's quadratic term and
the embeddings left out) and by its ``max_length``. The estimate is an upper bound in one
respect: every epoch of every trial is counted (pruning and early stopping cut it; with the
default median pruner trials ran 0.87x the compute in ``benchmarks/sweep_cost.py``). It leaves
out start-up (model loading, Ray), preparation (BM25, tokenization: CPU work before any GPU) and
the supervised selectors' training.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path

import yaml

from orchestrator.sweep.grid import Cell, SweepSpec, expand_grid, sweep_file
from workloads.errors import InputError
from workloads.kinds import kind_of


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


# GPU figures for BERT-base at 512 tokens, mixed precision, one GPU, are assumptions derived from
# the GPUs' published dense bf16 peaks and a model-FLOP utilisation typical of BERT fine-tuning:
# training 6 x 85M non-embedding parameters x 512 tokens = 2.6e11 FLOP per pair at 35-40%
# utilisation, scoring a third of that at ~45%. Replace them with measured numbers
# (`--throughput FILE`) when you have them: they are the estimate's largest uncertainty.
THROUGHPUTS = {
    "cpu-2core": Throughput(
        "cpu-2core", "minilm-l6", 128, 12.8, 52.3,
        "measured by benchmarks/throughput.py on a 2-core AMD EPYC with AVX512-BF16, no AMX (bf16 autocast, 1 thread, "
        "SciFact pairs at 128 tokens)", cpus=1),
    "a10g": Throughput("a10g", "bert-base-uncased", 512, 170.0, 600.0,
                       "assumption: A10G (AWS g5), 125 TFLOP/s dense bf16 peak at ~35% (train) / ~45% (score)"),
    "a100": Throughput("a100", "bert-base-uncased", 512, 450.0, 1500.0,
                       "assumption: A100, 312 TFLOP/s dense bf16 peak at ~38% (train) / ~45% (score)"),
    "h100": Throughput("h100", "bert-base-uncased", 512, 1300.0, 4300.0,
                       "assumption: H100 SXM, 989 TFLOP/s dense bf16 peak at ~35% (train) / ~40% (score)"),
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
    import json

    from workloads.models.cross_encoder import resolve_model_name

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


def _flops_per_token(shape: tuple[int, int, int]) -> float:
    layers, hidden, inner = shape
    return layers * (4 * hidden * hidden + 2 * hidden * inner)


@cache  # once per split, not per cell and target (doc19: 255 cells x 7 targets)
def judged_queries(collection: str, split: str) -> int | None:
    """Judged queries of a split: counted in local BEIR qrels, else the table, else None."""
    from workloads.paths import data_dir

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
            profiles[name] = Throughput(name=name, **{"source": f"{path}", **fields})
    except (OSError, yaml.YAMLError, TypeError, AttributeError) as exc:
        raise InputError(str(path), f"not a throughput file (name: {{model, tokens, train_pairs_per_second, "
                                    f"score_pairs_per_second[, source, cpus]}}): {str(exc).splitlines()[0]}") from None
    return profiles


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
    """(training pairs of one trial, its validation pairs, the winner's test pairs); None where a
    size is not known here (``size: full``, a validation split of unknown size, a test set)."""
    spec = cell.spec
    if sweep.is_ear:
        return _ear_cell_pairs(cell, sweep)
    epochs = kind_of(spec).epochs(spec)
    size = spec.training_data.size if isinstance(spec.training_data.size, int) else None
    train = None if size is None else size * (2 if spec.augmentation.method != "none" else 1) * epochs
    if spec.data.validation_split is None:
        queries = spec.data.validation_queries  # carved from the training split
    else:
        queries = spec.data.validation_cap or judged_queries(spec.data.collection, spec.data.validation_split)
    validation = None if queries is None else queries * spec.first_stage.validation_depth * epochs
    targets = [(spec.data.test_collection or spec.data.collection, spec.data.test_split)]
    targets += [(z.collection, z.split) for z in sweep.zero_shot]
    counts = [judged_queries(c, s) for c, s in targets]
    test = None if None in counts else sum(counts) * spec.first_stage.test_depth * (1 + len(spec.robustness))
    return train, validation, test


def _ear_cell_pairs(cell: Cell, sweep: SweepSpec) -> tuple[int | None, int | None, int | None]:
    """An EAR cell's pairs, at its largest searched n: every training query's n expansions per
    epoch (at most: queries whose expansions all rank alike are skipped), every validation
    query's per epoch, then the winner's test and its keeping (every query's expansions once)."""
    spec = cell.spec
    n = max(sweep.search.n.choices) if sweep.search.n is not None else spec.expansion.n
    data = spec.data
    train_queries = judged_queries(data.collection, data.train_split)
    if data.validation_split is None:
        validation_queries = data.validation_queries
        train_queries = None if train_queries is None or validation_queries is None else train_queries - validation_queries
    else:
        validation_queries = data.validation_cap or judged_queries(data.collection, data.validation_split)
    test_queries = judged_queries(data.collection, data.test_split)
    epochs = spec.ear.epochs
    train = None if train_queries is None else train_queries * n * epochs
    validation = None if validation_queries is None else validation_queries * n * epochs
    known = None not in (train_queries, validation_queries, test_queries)
    test = (train_queries + validation_queries + 2 * test_queries) * n if known else None
    return train, validation, test


def estimate(sweep: SweepSpec, profile: Throughput, trials_left: dict[str, int] | None = None,
             price_per_hour: float | None = None) -> dict:
    """The grid's compute on ``profile``: per cell and in all, device-hours (one worker's device
    each: a trial of ``workers`` workers costs that many times its wall time). ``trials_left``:
    the trials each cell still has to run (default: all of them)."""
    reference = _flops_per_token(model_shape(profile.model)[0]) * profile.tokens
    cells, shapes, unknown = [], {}, set()
    for cell in expand_grid(sweep):
        if cell.spec is None:
            continue
        spec = cell.spec
        shape, shape_source = model_shape(spec.model.name)
        shapes[spec.model.name] = shape_source
        scale = _flops_per_token(shape) * spec.model.max_length / reference
        if profile.cpus:  # a CPU profile: more threads per worker, proportionally faster (roughly)
            scale *= profile.cpus / spec.resources.cpus_per_worker
        train, validation, test = _cell_pairs(cell, sweep)
        trials = sweep.search.trials_per_cell if trials_left is None else trials_left.get(cell.key, 0)
        if None in (train, validation, test):
            unknown.add(cell.key)
        tested = (test or 0) if trials else 0  # a cell with trials left is tested (again) at its end
        workers = spec.resources.workers
        cells.append(CellEstimate(
            cell.key, cell.axes, trials, train, validation, test,
            # data parallel: the workers share the pairs, so the device time is the pairs' (ideal scaling)
            train_hours=trials * (train or 0) * scale / profile.train_pairs_per_second / 3600,
            # rank 0 validates while the other workers wait and hold their devices; a test is one worker's task
            evaluation_hours=(trials * (validation or 0) * workers + tested) * scale / profile.score_pairs_per_second / 3600))
    return {
        "profile": asdict(profile),
        "device_hours": sum(c.hours for c in cells),
        "train_hours": sum(c.train_hours for c in cells),
        "evaluation_hours": sum(c.evaluation_hours for c in cells),
        "price_per_hour": price_per_hour,
        "cost": sum(c.hours for c in cells) * price_per_hour if price_per_hour is not None else None,
        "trials": sum(c.trials for c in cells),
        "model_shapes": shapes,
        "cells_with_unknown_sizes": sorted(unknown),
        "cells": [{**asdict(c), "hours": c.hours} for c in cells],
        "assumptions": [
            "every epoch of every trial runs (pruning and early stopping only lower it)",
            "throughput scales with each model's transformer multiply-adds per token and with max_length",
            "start-up, preparation (CPU) and the supervised selectors' training are not counted",
        ],
    }


def default_profile(sweep: SweepSpec) -> str:
    """a10g (``cluster.yaml``'s GPU) for a grid that asks for GPUs, else the CPU profile."""
    cells = [c for c in expand_grid(sweep) if c.spec is not None]
    return "a10g" if any(c.spec.resources.use_gpu is True for c in cells) else "cpu-2core"


def choose_profile(sweep: SweepSpec, name: str | None, path: Path | None) -> Throughput:
    profiles = load_throughputs(path)
    name = name or default_profile(sweep)
    if name not in profiles:
        raise InputError(sweep_file(sweep) or sweep.name, f"--device {name}: no such throughput profile (known: "
                                                          f"{', '.join(sorted(profiles))}; add one with --throughput FILE)")
    return profiles[name]
