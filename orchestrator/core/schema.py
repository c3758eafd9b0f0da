"""The run store's vocabulary: every tag key, run kind, metric name and the objective.

One module owns them, so a trial tracked by ``orchestrate run``, a sweep's trial and cell
runs, and everything that reads them back (status, report, compare) agree on what a name
means. The per-epoch metrics are the data plane's (``workloads.training``: ``val_*``,
``train_*``, ``epoch_*``); this module names everything MLflow holds around them.

Metric names of an evaluation target (``test``, ``zs_<collection>_<split>``, ``robust_<perturbation>``):
``<target>_<measure>`` is the final ranking, ``<target>_cross_encoder_<measure>`` the
cross-encoder alone when the final ranking fuses the first stage,
``bm25_<target>_<measure>`` the first stage, ``<target>_interpolation_weight`` the weight
used. Each has its per-query values as the artifact ``per_query/<prefix without _>.json``.
These are the code's names; MLflow stores them grouped by slashes (``test/ndcg_at_10``,
:func:`stored_metric_name`), and the tracker hands them back under the code's names.
"""

from __future__ import annotations

from workloads.evaluation import MEASURES
from workloads.kinds import SELECTOR_DATA_TAG as SELECTOR_DATA_TAG  # a kind's tag (the selectors' data)
from workloads.kinds import TRIAL_KINDS
from workloads.training import SELECTION_METRIC
from workloads.training.epoch_metrics import CROSS_ENCODER_PREFIX, EPOCH_METRIC_PREFIXES, EPOCH_METRICS, WEIGHT_METRIC

# ----------------------------------------------------------------------------- tags

TRIAL_KEY_TAG = "rerank_lab.trial_key"  # a run's identity: found again on every rerun
KIND_TAG = "rerank_lab.kind"
SWEEP_TAG = "rerank_lab.sweep"
CELL_TAG = "rerank_lab.cell"
OPTUNA_TAG = "rerank_lab.optuna_trial"
WINNER_TAG = "rerank_lab.winner"        # on a cell: its winning trial run; on that trial run: "true"
# The next five predate the rerank_lab. prefix; stores written before keep them, so do we.
WINNER_PARAMS_TAG = "winner_params"
BASELINE_TAG = "baseline"
CHECKPOINT_TAG = "best_checkpoint"      # on a trial run: its chosen epoch's checkpoint; on a selector run: the trained selector
# SELECTOR_DATA_TAG (imported above, the kinds' protocol): on a selector run and its cells, cell or full
FAILURE_TAG = "failure"                 # error | oom | evaluation | all trials failed | requirement
PRUNED_TAG = "pruned_at_epoch"          # a trial run its cell's pruner stopped (status KILLED): the last epoch it trained
INTERRUPTED_TAG = "rerank_lab.interrupted"  # a run Ctrl-C stopped (status KILLED): resumed by the next run of the command
DATA_TAG = "rerank_lab.data"            # on a trial run: the identity of the data it trained and was validated on
TEST_DATA_TAG = "rerank_lab.test_data"  # on a tested run: the identity of the data of every target it was tested on
MODEL_TAG = "rerank_lab.model"          # on a cell run: the winning trial run whose model is its artifact MODEL_ARTIFACT
KEPT_TAG = "rerank_lab.kept"            # on a cell run of EAR trials: where its winner is kept (reranker, run)
MODEL_ARTIFACT = "model"                # the artifact path of a cell winner's model (CrossEncoder.from_pretrained loads it)
SWEEP_FILE_TAG = "rerank_lab.sweep_file"  # on a sweep's experiment: the sweep file it belongs to
STALE_TAG = "rerank_lab.stale"          # a finished trial run whose data changed since (its identity key gains @stale)
ERROR_TAG = "error"                     # the last line of the error
PARENT_TAG = "mlflow.parentRunId"        # MLflow's own: nests runs in the UI
NOTE_TAG = "mlflow.note.content"         # MLflow's own: a run's description
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"  # MLflow 3 opens such experiments on their runs table

# Run kinds (KIND_TAG values).
SWEEP, CELL, TRIAL = "sweep", "cell", "trial"  # a re-ranking trial's runs are TRIAL (its kind's run_kind)
# the runs of the trials a sweep's plan groups as its selectors (``TrialKind.plan_group``): status and the report read them
SELECTORS_GROUP = "selectors"
SELECTOR = next(kind.run_kind for kind in TRIAL_KINDS.values() if kind.plan_group == SELECTORS_GROUP)


def run_kinds() -> tuple[str, ...]:
    """Every KIND_TAG value: a sweep's, a cell's, then each registered trial kind's (read when asked)."""
    return (SWEEP, CELL, *dict.fromkeys(kind.run_kind for kind in TRIAL_KINDS.values()))

# The axes of a grid: MLflow tags on trial and cell runs alike; a cell's key hashes GRID_AXES.
GRID_AXES = ("model", "loss", "augmentation", "size", "seed")
AXES = (*GRID_AXES, "collection")

# ----------------------------------------------------------------------------- metrics

VALIDATION_PREFIX = "val_"
OBJECTIVE = SELECTION_METRIC  # what every trial maximises and every epoch is chosen on (the data plane's rule)
BEST_PREFIX = "best_"                                # the chosen epoch's val_* metrics
BEST_OBJECTIVE = f"{BEST_PREFIX}{OBJECTIVE}"
BEST_EPOCH = "best_epoch"
TUNED_WEIGHT = WEIGHT_METRIC                          # per epoch: the weight tuned on validation
VALIDATION_CROSS_ENCODER_PREFIX = CROSS_ENCODER_PREFIX
FIRST_STAGE = "bm25"
TEST = "test"                                         # the trial's own test data
TRIALS_COMPLETE = "trials_complete"                   # on a cell run
EPOCHS_RUN = "epochs_run"                             # on a selector run: epochs trained before early stopping

# One timing vocabulary (seconds), on trial runs of `run` and of sweeps.
TIME_PREPARE = "time_prepare_seconds"          # data preparation in the driver (shared in sweeps: 0 there)
TIME_TRAIN_WALL = "time_train_wall_seconds"    # Ray Train from submission to the last report
TIME_TRAINING = "time_training_seconds"        # inside the loop: every epoch's training and validation
TIME_PER_EPOCH = "time_train_seconds_per_epoch"
TIME_OVERHEAD = "time_overhead_seconds"        # wall minus training: worker start, model load, checkpoints
# where the overhead goes (epoch metrics summed; the rest is checkpoint persistence and shut-down)
TIME_STARTUP = "time_startup_seconds"          # Ray Train: submission to the loop's first line (controller, worker group)
TIME_SETUP = "time_setup_seconds"              # the loop's start: training set, model, tokenized pairs, optimizer
TIME_CHECKPOINT = "time_checkpoint_seconds"    # writing every epoch's checkpoint
TIME_EVALUATION = "time_evaluation_seconds"    # the chosen checkpoint on every evaluation target
TIME_TRIAL = "time_trial_seconds"              # the whole trial


def target_prefix(target: str) -> str:
    return f"{target}_"


def cross_encoder_prefix(target: str) -> str:
    return f"{target}_cross_encoder_"


def first_stage_prefix(target: str) -> str:
    """``bm25_test_``; ``bm25_val_`` for the validation queries."""
    return f"{FIRST_STAGE}_{target}_"


def weight_metric(target: str) -> str:
    return f"{target}_interpolation_weight"


def zero_shot_target(collection: str, split: str) -> str:
    return f"zs_{collection.rsplit('/', 1)[-1]}_{split}"


ROBUSTNESS_PREFIX = "robust_"
QUERIES_ARTIFACTS = "queries"  # per target: queries/<target>.tsv, the query texts it was tested on


def perturbed_target(perturbation: str) -> str:
    """The trial's own test queries perturbed (``robust_typo``)."""
    return f"{ROBUSTNESS_PREFIX}{perturbation}"


def is_epoch_metric(name: str) -> bool:
    """A metric the training loop reports per epoch (not Ray's or Tune's bookkeeping)."""
    return name in EPOCH_METRICS or name.startswith(EPOCH_METRIC_PREFIXES)


# What MLflow stores: the code's names with their parts grouped by slashes (``test/ndcg_at_10``,
# ``test/cross_encoder/ndcg_at_10``, ``bm25/test/ndcg_at_10``, ``best/val/ndcg_at_10``), so the UI
# sorts a target's measures together and folds them into one section per target. Every part
# keeps its order and a slash replaces one underscore, so the code's name is the stored one with
# "/" read as "_": stores written before (flat names) read the same.
_GROUPED_SUFFIXES = tuple(sorted((*MEASURES, "interpolation_weight"), key=len, reverse=True))
# A cell's statistics of a measure (orchestrator.sweep.winners.log_cell_statistics) follow it in its section:
# ``test_ndcg_at_10_ci_low`` -> ``test/ndcg_at_10_ci_low``.
STATISTIC_SUFFIXES = ("seed_mean", "seed_std", "seeds", "difference", "ci_low", "ci_high")


def stored_metric_name(name: str) -> str:
    """The name MLflow stores a metric under (``test_ndcg_at_10`` -> ``test/ndcg_at_10``);
    names that are not a target's measure (timings, counts, the loss) are stored as they are."""
    statistic = next((s for s in STATISTIC_SUFFIXES if name.endswith(f"_{s}")), None)
    if statistic is not None:
        measure = stored_metric_name(name[: -len(statistic) - 1])
        if measure != name[: -len(statistic) - 1]:
            return f"{measure}_{statistic}"
    suffix = next((s for s in _GROUPED_SUFFIXES if name.endswith(f"_{s}")), None)
    if suffix is None:
        return name
    target = name[: -len(suffix) - 1]
    parts = []
    for lead in (BEST_PREFIX, f"{FIRST_STAGE}_"):
        if target.startswith(lead) and len(target) > len(lead):
            parts.append(lead.rstrip("_"))
            target = target[len(lead):]
    encoder = "_cross_encoder"
    if target.endswith(encoder) and len(target) > len(encoder):
        return "/".join([*parts, target.removesuffix(encoder), encoder.lstrip("_"), suffix])
    return "/".join([*parts, target, suffix])


def code_metric_name(stored: str) -> str:
    """The code's name of a stored metric, whichever way the store names it."""
    return stored.replace("/", "_")


def measures(metrics: dict[str, float], prefix: str) -> dict[str, float]:
    """The evaluation measures logged under ``prefix``, without it (``test_`` -> {ndcg_at_10: ...})."""
    return {k.removeprefix(prefix): v for k, v in metrics.items() if k.startswith(prefix) and k.removeprefix(prefix) in MEASURES}


# ----------------------------------------------------------------------------- params


def comparison_params(cell_axes: dict[str, str], searched: dict) -> dict[str, str]:
    """The MLflow params a cell run and its trial runs share, under short names, so that MLflow's
    compare views (parallel coordinates, scatter, contour) can put a grid axis or a
    hyper-parameter against a metric at either level: the grid axes (``model``, ``loss``,
    ``augmentation``, ``size``, ``seed``) and the searched hyper-parameters (``learning_rate``,
    ``lambda``, ``tau``, ``k``, ...; a trial's own values, a cell's winner's). The full spec stays
    on trial runs as ``section.field`` params."""
    return {**{a: str(cell_axes[a]) for a in GRID_AXES if a in cell_axes},
            **{name.rstrip("_"): str(value) for name, value in searched.items()}}


def flat_params(spec) -> dict[str, str]:
    """Every resolved field as ``section.key -> value`` (MLflow params)."""
    out: dict[str, str] = {}

    def walk(prefix: str, value) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                walk(f"{prefix}.{key}" if prefix else key, inner)
        else:
            out[prefix] = str(value)

    walk("", spec.model_dump(mode="json", by_alias=True))
    return out
