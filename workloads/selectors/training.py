"""Selector training (select-and-rank), run once per data-parallel worker, like the
cross-encoder loop (``workloads.training``): prepare on the driver, train in workers that
report one record per epoch with its checkpoint, choose the epoch on validation, test it,
install it in the cache.

Each step: a batch of training triples -> (q, d+) and (q, d-) pairs; the selector scores
every sentence of each document, the relaxed top-k picks ``k`` (seeded Gumbel noise per
step), the ranker scores the pair on them; the ranking loss of the registry (pointwise
BCE, or the pairwise hinge) trains both. AdamW, linear warm-up for ``warmup_steps`` then
constant, gradient clipping at 1. After each epoch the select-and-rank model re-ranks the
validation candidates (deterministic top-k); training stops after ``patience`` epochs
without a better validation nDCG@10 (the reference stops on MAP; every epoch of this
project is chosen on nDCG@10, so early stopping watches the same number).
"""

from __future__ import annotations

import json
import random
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch
import torch.distributed as dist
from transformers import get_constant_schedule_with_warmup

from workloads.batches import triples_to_batch
from workloads.evaluation import PRIMARY_METRIC, evaluate
from workloads.logs import get_logger, progress_bar
from workloads.losses import ModelOutputs, build_ranking_loss
from workloads.models.cross_encoder import autocast_dtype
from workloads.paths import atomic_path, cache_dir, stable_key
from workloads.reranking import Reranking, merge_with_first_stage
from workloads.retrieval.bm25 import read_trec_run
from workloads.selectors.select_and_rank import SelectAndRank
from workloads.selectors.spec import COMPLETE_MARKER, SelectorTrialSpec, selector_dir, selector_key
from workloads.training import Reporter, adamw, report_epoch
from workloads.trial import PreparedTrial, choose_epoch, prepare_trial

STATE_FILE = "selector_state.pt"


@dataclass(frozen=True)
class SelectorInputs:
    """What a worker reads: the training set, validation candidates and judgements, and the
    sentences of every document it will see."""

    training_set: str
    validation_candidates: str
    validation_first_stage_run: str
    validation_qrels: dict[str, dict[str, int]]
    relevance_level: int
    sentences: str


@dataclass(frozen=True)
class PreparedSelector:
    inputs: SelectorInputs
    trial: PreparedTrial  # the same data as the plain re-ranking trial (test candidates, BM25 baselines)


def _sentence_file(collection, paths: list[str]) -> str:
    """The candidate sentences of every document in these Parquet files (training set or
    candidates), cached: workers load these, not the whole corpus's."""
    from workloads.augmentation import SPLITTER_VERSION, corpus_sentences

    path = cache_dir() / "selector-sentences" / f"{stable_key(*[Path(p).name for p in paths], SPLITTER_VERSION)}.parquet"
    if not path.exists():
        needed: set[str] = set()
        for file in paths:
            table = pq.read_table(file)
            for column in ("positive_id", "negative_id", "doc_id"):
                if column in table.column_names:
                    needed.update(table.column(column).to_pylist())
        every = corpus_sentences(collection)
        ids = sorted(needed)
        with atomic_path(path, ".parquet") as tmp:
            pq.write_table(pa.table({"doc_id": ids, "sentences": [every[d] for d in ids]}), tmp)
    return str(path)


def prepare_selector(spec: SelectorTrialSpec) -> PreparedSelector:
    """The selector's data: the plain trial's (cached by content), plus the documents' sentences."""
    from workloads.collections import resolve_collection

    trial = prepare_trial(spec.as_rerank_trial())
    training = trial.training
    files = [training.training_set, training.validation_candidates]
    sentences = _sentence_file(resolve_collection(spec.data.collection), files)
    return PreparedSelector(SelectorInputs(training.training_set, training.validation_candidates,
                                           training.validation_first_stage_run, training.validation_qrels,
                                           training.relevance_level, sentences), trial)


def load_sentences(path: str) -> dict[str, list[str]]:
    table = pq.read_table(path).to_pydict()
    return dict(zip(table["doc_id"], table["sentences"]))


def rerank_with_selector(model: SelectAndRank, candidates: Path, first_stage: dict, qrels, relevance_level: int,
                         sentences: dict[str, list[str]], batch_size: int, label: str) -> Reranking:
    """Re-rank first-stage candidates with the select-and-rank model (deterministic top-k)."""
    table = pq.read_table(candidates, columns=["query_id", "query", "doc_id"]).to_pydict()
    started, last = time.perf_counter(), [time.perf_counter()]

    def progress(done: int, total: int) -> None:
        if time.perf_counter() - last[0] >= 30 or done == total:
            last[0] = time.perf_counter()
            get_logger("score").info(f"{label}: {done:,}/{total:,} pairs ({done / max(last[0] - started, 1e-9):.1f} pairs/s)")

    scores = model.score_pairs(table["query"], [sentences[d] for d in table["doc_id"]], table["doc_id"], batch_size, progress)
    reranked: dict[str, dict[str, float]] = {}
    for qid, doc_id, score in zip(table["query_id"], table["doc_id"], scores):
        reranked.setdefault(qid, {})[doc_id] = score
    ranking = merge_with_first_stage(reranked, first_stage)
    return Reranking(evaluate(ranking, qrels, relevance_level), ranking)


def parameter_groups(model: SelectAndRank, learning_rate: float, selector_learning_rate: float | None) -> list[dict]:
    """The ranker (and the embeddings it shares) at ``learning_rate``; the selector's own
    parameters at ``selector_learning_rate`` (default: the same)."""
    shared = {id(p) for p in model.ranker.parameters()}
    own = [p for p in model.selector.parameters() if p.requires_grad and id(p) not in shared]
    ranker = [p for p in model.ranker.parameters() if p.requires_grad]
    return [{"params": ranker, "lr": learning_rate}, {"params": own, "lr": selector_learning_rate or learning_rate}]


def _rank_and_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def train_selector(spec: SelectorTrialSpec, inputs: SelectorInputs, report: Reporter, device: torch.device | None = None,
                   resume_from: Path | None = None) -> None:
    rank, world = _rank_and_world()
    say = get_logger("selector").info if rank == 0 else (lambda message: None)
    device = device or torch.device("cpu")
    sel = spec.selector
    random.seed(spec.seed)
    torch.manual_seed(spec.seed)
    if resume_from is not None:
        model = SelectAndRank.load(resume_from, spec.model.max_length)
    else:
        model = SelectAndRank.build(spec.method, sel, spec.model.name, spec.model.max_length, spec.model.pooling)
    model.to(device)
    wrapped: torch.nn.Module = model
    if world > 1:
        wrapped = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                                            find_unused_parameters=True)
    loss_fn = build_ranking_loss(sel.loss, **({"margin": sel.margin} if sel.loss == "pairwise" else {}))
    amp_dtype = autocast_dtype(device, spec.precision)
    optimizer = adamw(parameter_groups(model, sel.learning_rate, sel.selector_learning_rate))
    scheduler = get_constant_schedule_with_warmup(optimizer, sel.warmup_steps)
    first_epoch, best, stale = 1, float("-inf"), 0
    if resume_from is not None and (Path(resume_from) / STATE_FILE).exists():
        state = torch.load(Path(resume_from) / STATE_FILE, map_location=device, weights_only=False)
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        first_epoch, best, stale = state["epoch"] + 1, state["best"], state["stale"]
        say(f"resumed from {resume_from} after epoch {state['epoch']}")
        if stale >= sel.patience:
            return  # it had stopped early: nothing left to train

    triples = pq.read_table(inputs.training_set).to_pylist()
    sentences = load_sentences(inputs.sentences)
    per_batch = sel.batch_size // 2
    steps = (len(triples) // per_batch) // world
    if steps == 0:
        raise ValueError(f"{len(triples)} triples make no full batch of {per_batch} triples per worker x {world} workers")
    validation_run = read_trec_run(Path(inputs.validation_first_stage_run))
    say(f"{spec.method} selector: {len(triples)} triples, {steps} steps/epoch, at most {sel.epochs} epochs "
        f"(patience {sel.patience}), k = {sel.k}, tau = {sel.tau}, on {device}")
    for epoch in range(first_epoch, sel.epochs + 1):
        wrapped.train()
        order = list(range(len(triples)))
        random.Random(spec.seed * 1_000 + epoch).shuffle(order)
        mine = [order[b * per_batch:(b + 1) * per_batch] for b in range(rank, steps * world, world)]
        started, total = time.perf_counter(), 0.0
        for step, rows_index in enumerate(mine, 1):
            rows = [triples[i] for i in rows_index]
            structure = triples_to_batch(rows).structure.to(device)  # pairs: (q, d+), (q, d-) per triple
            doc_ids = [d for r in rows for d in (r["positive_id"], r["negative_id"])]
            batch = model.batch([r["query"] for r in rows for _ in (0, 1)], [sentences[d] for d in doc_ids], doc_ids).to(device)
            # Arithmetic, not workloads.seeds: with hashed seeds the linear selector did not learn the
            # constructed task of its test in 5 epochs (0.0 -> 0.0); these collide only past 10,007 steps.
            generator = torch.Generator().manual_seed(spec.seed * 1_000_003 + epoch * 10_007 + step)
            with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
                scores, phi = wrapped(batch, generator)
            loss = loss_fn(ModelOutputs(scores.float(), phi.float()), structure)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            total += float(loss.detach())
            if step % max(1, len(mine) // 5) == 0 or step == len(mine):
                say(f"selector epoch {epoch} {progress_bar(step, len(mine))} step {step}/{len(mine)} loss {total / step:.4f}")
        metrics: dict[str, float] = {"epoch": epoch, "train_loss": total / len(mine),
                                     "epoch_train_seconds": time.perf_counter() - started}
        checkpoint = None
        stop = torch.zeros(1)
        if rank == 0:
            validated = time.perf_counter()
            validation = rerank_with_selector(model, Path(inputs.validation_candidates), validation_run,
                                              inputs.validation_qrels, inputs.relevance_level, sentences,
                                              sel.eval_batch_size, f"validate selector epoch {epoch}")
            metrics.update({f"val_{k}": v for k, v in validation.evaluation.aggregate.items()})
            metrics["epoch_validation_seconds"] = time.perf_counter() - validated
            value = metrics[f"val_{PRIMARY_METRIC}"]
            best, stale = (value, 0) if value > best else (best, stale + 1)
            checkpoint = Path(tempfile.mkdtemp(prefix=f"selector-epoch-{epoch}-"))
            model.save(checkpoint)
            torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "epoch": epoch,
                        "best": best, "stale": stale}, checkpoint / STATE_FILE)
            say(f"selector epoch {epoch}: validation {PRIMARY_METRIC} {value:.4f} (best {best:.4f}, "
                f"{stale} epoch(s) without improvement)")
            stop[0] = float(stale >= sel.patience)
        if world > 1:
            dist.broadcast(stop, 0)
        report_epoch(report, metrics, checkpoint)
        if stop[0]:
            say(f"early stop after epoch {epoch}: no better validation {PRIMARY_METRIC} in {sel.patience} epochs")
            break


def evaluate_selector_checkpoint(checkpoint: Path, prepared: PreparedSelector, spec: SelectorTrialSpec,
                                 device: torch.device | None = None) -> Reranking:
    """The select-and-rank model of ``checkpoint`` on the test candidates: its held-out ranking quality."""
    from workloads.collections import resolve_collection

    trial = prepared.trial
    model = SelectAndRank.load(checkpoint, spec.model.max_length).to(device or torch.device("cpu"))
    collection = resolve_collection(spec.data.test_collection or spec.data.collection)
    sentences = load_sentences(_sentence_file(collection, [trial.test_candidates]))
    return rerank_with_selector(model, Path(trial.test_candidates), read_trec_run(Path(trial.test_first_stage_run)),
                                trial.test_qrels, trial.test_relevance_level, sentences, spec.selector.eval_batch_size,
                                "test selector")


def install_selector(spec: SelectorTrialSpec, checkpoint: Path, summary: dict) -> Path:
    """Copy the chosen checkpoint to the selector cache (atomically; the result file last)."""
    final = selector_dir(spec)
    with atomic_path(final) as tmp:
        shutil.copytree(checkpoint, tmp, ignore=shutil.ignore_patterns(STATE_FILE))
        (tmp / COMPLETE_MARKER).write_text(json.dumps({"key": selector_key(spec), "spec": spec.model_dump(mode="json"),
                                                        **summary}, indent=1, sort_keys=True))
    get_logger("selector").info(f"selector {spec.name} -> {final}")
    return final


def train_selector_in_process(spec: SelectorTrialSpec, checkpoint_root: Path) -> tuple[Path, list[dict], Reranking]:
    """Prepare, train, choose, test and install a selector without Ray (tests, debugging)."""
    prepared = prepare_selector(spec)
    records: list[tuple[dict, Path]] = []

    def keep(metrics: dict[str, float], checkpoint: Path | None) -> None:
        final = checkpoint_root / f"epoch-{int(metrics['epoch'])}"
        final.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(checkpoint), final)
        records.append((dict(metrics), final))

    train_selector(spec, prepared.inputs, keep)
    metrics, checkpoint = records[choose_epoch([m for m, _ in records])]
    tested = evaluate_selector_checkpoint(checkpoint, prepared, spec)
    path = install_selector(spec, checkpoint, {"best_epoch": metrics["epoch"], **{f"best_{k}": v for k, v in metrics.items()
                                                                                   if k.startswith("val_")},
                                               **{f"test_{k}": v for k, v in tested.evaluation.aggregate.items()}})
    return path, [m for m, _ in records], tested


__all__ = ["SelectorInputs", "PreparedSelector", "prepare_selector", "train_selector", "evaluate_selector_checkpoint",
           "install_selector", "train_selector_in_process"]
