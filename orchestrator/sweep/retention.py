"""What a sweep keeps on its storage (``storage.keep``, ``storage.log_models``) and how much.

A finished trial keeps its chosen and last epoch checkpoints; once a cell's winner is tested,
the other trials' Train runs go and the winner's model is logged to MLflow's artifact store.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import optuna

from orchestrator.core import schema
from orchestrator.core.execution import IN_EPOCH_DIR
from orchestrator.core.tracking import Tracker
from orchestrator.sweep.grid import Cell, SweepSpec
from orchestrator.sweep.search import COUNTED, TRAIN_RUN, optuna_storage


def keep_chosen_and_last(train_run: Path, chosen: str | Path) -> None:
    """Delete a trial's epoch checkpoints (``<train_run>/epoch-<n>``) but its chosen one (tested if
    it wins) and its last. Only for a trial its cell's study holds as COMPLETE: Ray Train's own
    record of the run still lists the deleted ones, so this run must never be fitted again."""
    epochs = sorted(Path(train_run).glob("epoch-*"), key=lambda d: int(d.name.rpartition("-")[2]))
    keep = {Path(chosen).name, epochs[-1].name if epochs else None}
    for directory in epochs:
        if directory.name not in keep:
            shutil.rmtree(directory, ignore_errors=True)


def keep_winners(sweep: SweepSpec, tracker: Tracker, cells: list[Cell], cell_runs: dict[str, str], ray_storage: Path,
                 optuna_url: str) -> None:
    """For every tested cell: its winner's model as the cell run's artifact (``storage.log_models``)
    and, with ``storage.keep: winners``, the other trials' checkpoints deleted. Idempotent, and
    done for cells tested by an earlier invocation too (a driver killed in between)."""
    for cell in cells:
        run = tracker.client.get_run(cell_runs[cell.key])
        winner_run = run.data.tags.get(schema.WINNER_TAG)
        if run.info.status != "FINISHED" or not winner_run:
            continue
        winner = tracker.client.get_run(winner_run)
        if sweep.storage.keep == "winners":  # also when the driver died before the trial logger trimmed it
            keep_chosen_and_last(ray_storage / winner.info.run_name, winner.data.tags[schema.CHECKPOINT_TAG])
        if sweep.storage.log_models and run.data.tags.get(schema.MODEL_TAG) != winner_run:
            tracker.log_model(run.info.run_id, Path(winner.data.tags[schema.CHECKPOINT_TAG]))
            tracker.set_tags(run.info.run_id, {schema.MODEL_TAG: winner_run})
        if sweep.storage.keep != "winners":
            continue
        study = optuna.load_study(study_name=cell.key, storage=optuna_storage(optuna_url))
        for trial in study.get_trials(deepcopy=False):
            ended = trial.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED) or (
                trial.state == optuna.trial.TrialState.FAIL and trial.user_attrs.get(COUNTED))  # never run again
            name = trial.user_attrs.get(TRAIN_RUN)
            if ended and name and name != winner.info.run_name:  # a trial run is named by its Train run
                shutil.rmtree(ray_storage / name, ignore_errors=True)


def checkpoint_disk_use(ray_storage: Path) -> dict:
    """Bytes the sweep's trials hold on its storage (checkpoints, in-epoch state), in all and per
    trial that holds any (``storage.keep`` decides what stays)."""
    sizes = []
    if ray_storage.is_dir():
        for run in ray_storage.iterdir():  # a Train run per trial: epoch-<n>/ checkpoints, in-epoch state
            if run.is_dir() and (any(run.glob("epoch-*")) or (run / IN_EPOCH_DIR).exists()):
                sizes.append(sum(f.stat().st_size for f in run.rglob("*") if f.is_file()))
    return {"disk_bytes": sum(sizes), "disk_trials": len(sizes),
            "disk_per_trial_bytes": sum(sizes) / len(sizes) if sizes else None}
