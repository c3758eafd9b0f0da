"""One Optuna study per cell (TPE, seeded, durable SQLite storage), served to Ray Tune.

Design (README, "Sweeps"): a single Tune run holds every cell's trials in one scheduling
pool, so the cluster stays packed; :class:`CellStudiesSearcher` picks the next cell that
still needs trials and asks *that cell's* study (ask-and-tell, define-by-run, so each cell
samples only the hyper-parameters its loss and augmentation have). The Optuna storage is
the restore point: a COMPLETE trial is never run again; a trial left RUNNING by a killed
driver is re-asked with the same parameters and the same Ray Train run name, so it resumes
from its last epoch checkpoint.
"""

from __future__ import annotations

import functools
import itertools
import json
import random
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import optuna
from ray.tune.search import Searcher

from orchestrator.core.schema import OBJECTIVE, PRUNED_TAG
from orchestrator.sweep.grid import Cell, Choices, FloatRange, LevelChoices, SearchSpec, distinct_parameter_sets
from workloads.core.seeds import derived_seed
from workloads.evaluation import SELECTION_PER_QUERY
from workloads.kinds import TrialKind, kind_named, kind_of

COUNTED = "counted"          # user attr: a FAIL that uses up one of the cell's trials
TRAIN_RUN = "train_run"      # user attr: Ray Train run name (stable across resumes)
FAILURE = "failure"          # user attr: why a trial failed (error, oom)
INPUT_FAILURE = "input"      # a trial's outcome when its input is wrong: the sweep stops and says why
INPUT_ERROR_SOURCE, INPUT_ERROR_PROBLEM = "input_error_source", "input_error_problem"  # its report: the InputError

optuna.logging.set_verbosity(optuna.logging.WARNING)


@dataclass(frozen=True)
class TrialConfig:
    """What Tune hands a sweep's trial: written by :meth:`CellStudiesSearcher.suggest`, read by
    the Tune trial and the MLflow logger. Tune keeps a trial's config as a dict (in its saved
    experiment state, read again by a resumed driver): :meth:`as_dict` writes it, :meth:`of` reads it."""

    cell: str                 # the cell's key
    kind: str | None          # its trial kind's name (None in a config saved before cells had kinds: the default)
    axes: dict[str, str]      # the cell's axes (tags of the trial's run)
    tags: dict[str, str]      # the cell's other tags
    optuna_trial: int         # the trial's number in its cell's study
    train_run: str            # the Ray Train run name: stable across retries and resumes
    params: dict              # the sampled hyper-parameters
    spec: dict                # the cell's spec with ``params`` applied, as JSON
    storage: str              # where Ray Train keeps its runs (the sweep's Ray storage)

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def of(cls, config: dict) -> TrialConfig:
        return cls(**{"kind": None, "axes": {}, "tags": {}, **{k: v for k, v in config.items() if k in cls.__dataclass_fields__}})

    @property
    def trial_kind(self) -> TrialKind:
        return kind_named(self.kind)

    def trial_spec(self):
        """The trial's spec, validated by its kind."""
        return self.trial_kind.spec.model_validate(self.spec)


@functools.lru_cache(maxsize=8)
def optuna_storage(url: str) -> optuna.storages.RDBStorage:
    """The sweep's Optuna storage, one per process: every storage Optuna builds from a URL checks
    its schema against alembic's revision files (~50 ms), which per study of doc19's 255 cells
    took 13 s of each ``orchestrate status``. Removing the file (``orchestrate reset``) clears
    this cache."""
    return optuna.storages.RDBStorage(url)


def sample(trial: optuna.Trial, cell: Cell, search: SearchSpec) -> dict[str, float | int]:
    params: dict[str, float | int] = {}
    for name in cell.searched:
        space = getattr(search, name)
        if isinstance(space, FloatRange):
            params[name] = trial.suggest_float(name, space.low, space.high, log=space.log)
        elif isinstance(space, Choices):
            params[name] = trial.suggest_categorical(name, space.choices)
        elif isinstance(space, LevelChoices) and (options := space.for_levels(len(cell.spec.sir.levels))):
            params[name] = trial.suggest_categorical(name, options)  # Optuna categories are scalars: "48-16"
    return params


def make_pruner(search: SearchSpec) -> optuna.pruners.BasePruner:
    """The pruner a cell's study asks: its intermediate values are the validation nDCG@10 of
    each epoch (step = epoch), so a trial is compared with its own cell's trials at the same
    epoch. The Wilcoxon pruner is asked by :class:`QueryByQuery` instead (NopPruner here)."""
    if search.pruner == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=search.pruner_startup_trials, n_warmup_steps=0)
    if search.pruner == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=1, max_resource="auto", reduction_factor=3)
    return optuna.pruners.NopPruner()


def per_query_file(storage: str | Path, train_run: str) -> Path:
    """A trial's validation value of each query after each epoch: ``{"<epoch>": [values in query-id order]}``."""
    return Path(storage) / "per_query" / f"{train_run}.json"


class QueryByQuery:
    """A cell's trials as Optuna's WilcoxonPruner reads them: each validation query's nDCG@10
    after each epoch, step = (epoch - 1) x queries + the query's place in query-id order, so a
    trial is compared with the cell's best trial on the same queries at the same epochs.

    They live in an in-memory Optuna study beside the cell's own, and in one small JSON file
    per trial (:func:`per_query_file`) from which a resumed driver restores them: the cell's
    study keeps one value per epoch. In its SQLite storage doc19's 500 validation queries x 3
    epochs x 4 trials per cell made reading one of its 255 studies (every ``orchestrate
    status``) take 162 ms instead of 7 (Optuna loads every intermediate value of every trial)."""

    def __init__(self, p_threshold: float):
        with warnings.catch_warnings():  # Optuna marks it experimental
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            # n_startup_steps 0: it is asked once a whole epoch's queries are in
            pruner = optuna.pruners.WilcoxonPruner(p_threshold=p_threshold, n_startup_steps=0)
        self.study = optuna.create_study(direction="maximize", pruner=pruner)  # in memory
        self.live: dict[str, optuna.Trial] = {}  # train run -> its trial here
        self.restored = False

    @staticmethod
    def _steps(epochs: dict[str, list[float]]) -> dict[int, float]:
        return {(int(epoch) - 1) * len(values) + i: float(v) for epoch, values in epochs.items() for i, v in enumerate(values)}

    def restore(self, storage: str | Path, study: optuna.Study) -> None:
        """The cell's COMPLETE trials whose per-query values a driver kept (once per driver)."""
        self.restored = True
        for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
            file = per_query_file(storage, trial.user_attrs.get(TRAIN_RUN, ""))
            if trial.user_attrs.get(TRAIN_RUN) and file.exists():
                self.study.add_trial(optuna.trial.create_trial(value=trial.value,
                                                               intermediate_values=self._steps(json.loads(file.read_text()))))

    def should_prune(self, storage: str | Path, train_run: str, epoch: int, values: list[float]) -> bool:
        """Keep the epoch's values (file and study) and ask the pruner about the trial."""
        file = per_query_file(storage, train_run)
        epochs = json.loads(file.read_text()) if file.exists() else {}  # a resumed trial's earlier epochs too
        epochs[str(epoch)] = values
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(json.dumps(epochs))
        trial = self.live.get(train_run)
        if trial is None:  # (a trial resumed by a new driver: its earlier epochs too)
            trial, pending = self.study.ask(), epochs
            self.live[train_run] = trial
        else:
            pending = {str(epoch): values}
        for step, value in self._steps(pending).items():
            trial.report(value, step)
        return trial.should_prune()

    def finished(self, train_run: str, value: float | None) -> None:
        """The trial ended: COMPLETE with its value (it may become the best), else dropped."""
        trial = self.live.pop(train_run, None)
        if trial is not None:
            self.study.tell(trial, value) if value is not None else self.study.tell(trial, state=optuna.trial.TrialState.FAIL)


def cell_seed(cell: Cell, search: SearchSpec) -> int:
    """The cell's sampler seed: per cell, so two cells do not sample one sequence."""
    return (search.sampler_seed * 1_000_003 + int(cell.key.removeprefix("cell-")[:8], 16)) % 2**31


def open_study(storage_url: str, cell: Cell, search: SearchSpec) -> optuna.Study:
    """The cell's study. Its sampler is set again before every ask (:func:`slot_sampler`), so
    what a trial draws depends on its slot, never on how often the driver restarted."""
    study = optuna.create_study(study_name=cell.key, storage=optuna_storage(storage_url), direction="maximize",
                                pruner=make_pruner(search), load_if_exists=True)
    study.sampler = slot_sampler(cell, search, slot=0)
    return study


def slot_sampler(cell: Cell, search: SearchSpec, slot: int, attempt: int = 0) -> optuna.samplers.TPESampler:
    """The sampler that draws the cell's ``slot``-th trial (``attempt``: the draws after a
    repeated parameter set). One seeded stream per slot, not one per study: a killed driver's
    rerun fails the interrupted Optuna trial and asks it again as a new one, and a single
    stream (restarted, or carried on) would hand the next slot other parameters than a run
    without the kill draws. TPE's startup draws (``n_startup_trials``: the first 4 of a cell) are
    pure functions of the seed; after them TPE reads the cell's finished trials, which are the same
    in both runs when the cell's trials run one at a time (with several of a cell in flight, what
    has finished when a slot is asked depends on timing, with or without a fault)."""
    seed = cell_seed(cell, search) if slot == attempt == 0 else derived_seed("slot", cell_seed(cell, search), slot, attempt) % 2**31
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=min(4, search.trials_per_cell))


def train_run_names(study: optuna.Study) -> set[str]:
    return {t.user_attrs[TRAIN_RUN] for t in study.get_trials(deepcopy=False) if t.user_attrs.get(TRAIN_RUN)}


def next_slot(study: optuna.Study, cell_key: str) -> int:
    """The cell's next trial's place: the first whose Train run name (``<cell>-t<slot>``) no trial
    holds yet. A trial's identity (its run name, its MLflow key, its draw) is its slot, not its
    Optuna number: an interrupted trial asked again and a repeated draw take Optuna numbers but
    no slot, so the cell's trials are named as in a run without faults."""
    used = train_run_names(study)
    return next(n for n in itertools.count() if f"{cell_key}-t{n}" not in used)


def tried_parameters(study: optuna.Study, exclude: int | None = None) -> list[dict]:
    """The parameter sets a cell has tried or is trying: every trial but the uncounted failures
    (interrupted or duplicate draws, asked again) and ``exclude``."""
    states = optuna.trial.TrialState
    return [t.params for t in study.get_trials(deepcopy=False)
            if t.number != exclude and t.params and (t.state in (states.COMPLETE, states.PRUNED, states.RUNNING)
                                                      or (t.state == states.FAIL and t.user_attrs.get(COUNTED)))]


def untried(cell: Cell, search: SearchSpec, tried: list[dict], seed: int) -> dict | None:
    """A parameter set of a finite search space the cell has not tried (None: none is left or the
    space is a range), drawn in a seeded order."""
    if distinct_parameter_sets(cell, search) is None:
        return None
    options = {}
    for name in cell.searched:
        space = getattr(search, name)
        if isinstance(space, Choices):
            options[name] = list(space.choices)
        elif isinstance(space, LevelChoices):
            options[name] = space.for_levels(len(cell.spec.sir.levels))
    combos = [dict(zip(options, values)) for values in itertools.product(*options.values())]
    random.Random(seed).shuffle(combos)
    return next((c for c in combos if c not in tried), None)


def finished_trials(study: optuna.Study) -> int:
    """Trials that used up one of the cell's slots: COMPLETE, PRUNED, or FAIL after their retries."""
    return count_finished(study.get_trials(deepcopy=False))


def count_finished(trials: list[optuna.trial.FrozenTrial]) -> int:
    states = optuna.trial.TrialState
    return sum(1 for t in trials if t.state in (states.COMPLETE, states.PRUNED) or (t.state == states.FAIL and t.user_attrs.get(COUNTED)))


def running_trials(study: optuna.Study) -> int:
    return len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)))


def requeue_interrupted(study: optuna.Study) -> int:
    """Trials a killed driver left RUNNING: fail them (uncounted) and enqueue their params
    again, carrying their Train run name so the retry resumes from their checkpoints."""
    requeued = 0
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
        study.enqueue_trial(trial.params, user_attrs={TRAIN_RUN: trial.user_attrs.get(TRAIN_RUN)}, skip_if_exists=False)
        requeued += 1
    return requeued


def stop_file(storage: str | Path, train_run: str) -> Path:
    """The file whose existence asks a trial's training loop to stop (its cell's pruner decided)."""
    return Path(storage) / "pruned" / train_run


class CellStudiesSearcher(Searcher):
    """A Tune searcher that serves every cell's own Optuna study, round-robin."""

    def __init__(self, cells: list[Cell], search: SearchSpec, storage_url: str, interruption=None, metric: str = OBJECTIVE):
        super().__init__(metric=metric, mode="max")
        self.interruption = interruption  # while it is set, a trial that ends in error was stopped, not failed
        self.cells = [c for c in cells if c.spec is not None]
        self.search = search
        self.studies = {c.key: open_study(storage_url, c, search) for c in self.cells}
        self.live: dict[str, tuple[str, optuna.Trial]] = {}  # tune trial id -> (cell key, asked Optuna trial)
        self.best_seen: dict[str, float] = {}       # tune trial id -> best objective so far
        self.pruning: set[str] = set()              # tune trial ids asked to stop
        self.pruned: dict[str, int] = {}            # tune trial id -> the last epoch it trained (it stopped)
        self.epochs = {c.key: kind_of(c.spec).epochs(c.spec) for c in self.cells}
        self.query_by_query = ({c.key: QueryByQuery(search.wilcoxon_p) for c in self.cells}
                               if search.pruner == "wilcoxon" else {})
        self.storage = ""                           # where Ray Train keeps the trials' runs (set at run time)
        # cell key -> a concurrent.futures.Future of what the cell needs first (its selector, its EAR
        # trial, trained concurrently): the cell's trials start once it is done; a failed one, never
        self.gates: dict = {}
        self._next = 0

    def __getstate__(self) -> dict:
        # Tune pickles its searcher to save its experiment state; the gates are this process's
        # Futures (which hold locks): a saved copy has nothing to wait for
        return {**self.__dict__, "gates": {}}

    def remaining(self) -> int:
        return sum(max(0, self.search.trials_per_cell - finished_trials(s) - running_trials(s)) for s in self.studies.values())

    def suggest(self, trial_id: str):
        waiting = False
        for offset in range(len(self.cells)):
            cell = self.cells[(self._next + offset) % len(self.cells)]
            study = self.studies[cell.key]
            if finished_trials(study) + running_trials(study) >= self.search.trials_per_cell:
                continue
            gate = self.gates.get(cell.key)
            if gate is not None and not (gate.done() and gate.exception() is None):
                waiting = waiting or not gate.done()  # a failed requirement: its cell is never served
                continue
            # ask() hands out enqueued (interrupted, WAITING) trials first
            self._next = (self._next + offset + 1) % len(self.cells)
            trial, params, train_run = self._ask_new(study, cell)
            trial.set_user_attr(TRAIN_RUN, train_run)
            self.live[trial_id] = (cell.key, trial)
            spec = kind_of(cell.spec).apply_params(cell.spec, params)
            return TrialConfig(cell.key, kind_of(spec).name, cell.axes, cell.tags, trial.number, train_run, params,
                               spec.model_dump(mode="json"), self.storage).as_dict()
        return Searcher.FINISHED if not self.live and not waiting else None  # None: Tune asks again later

    DRAWS = 20  # samples tried before a finite space hands out an untried set itself

    def _ask_new(self, study: optuna.Study, cell: Cell) -> tuple[optuna.Trial, dict, str]:
        """An Optuna trial with a parameter set the cell has not tried yet, and its Train run name.
        An enqueued trial (an interrupted one, asked again) keeps its parameters and name. A draw
        that repeats a tried set is told FAIL (uncounted: it ran nothing) and asked again; a finite
        space whose sampler keeps repeating itself gets an untried set enqueued (``check_search``
        made sure there are enough)."""
        slot = next_slot(study, cell.key)
        for attempt in range(self.DRAWS + 1):
            study.sampler = slot_sampler(cell, self.search, slot, attempt)
            trial = study.ask()
            params = sample(trial, cell, self.search)
            if trial.user_attrs.get(TRAIN_RUN):
                return trial, params, trial.user_attrs[TRAIN_RUN]
            if params not in tried_parameters(study, exclude=trial.number):
                return trial, params, f"{cell.key}-t{slot}"
            trial.set_user_attr(FAILURE, "a repeated parameter set, drawn again")
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            if attempt == self.DRAWS - 1:
                fresh = untried(cell, self.search, tried_parameters(study), derived_seed("untried", cell.key, slot))
                if fresh is not None:
                    study.enqueue_trial(fresh)
        return trial, params, f"{cell.key}-t{slot}"  # a range drew the same floats 20 times: take it (practically unreachable)

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        if PRUNED_TAG in result:  # the trial stopped on its cell's request (now or before a crash)
            self.pruned[trial_id] = int(result[PRUNED_TAG])
            return
        self.should_prune(trial_id, result)
        if self.metric not in result:
            return
        if result.get("final"):  # the chosen epoch's value (the lifecycle's rule, e.g. SIR's last stage only)
            self.best_seen[trial_id] = result[self.metric]
        else:
            self.best_seen[trial_id] = max(self.best_seen.get(trial_id, float("-inf")), result[self.metric])

    def should_prune(self, trial_id: str, result: dict) -> bool:
        """Report an epoch's validation value to the trial's Optuna trial (step = epoch) and ask
        the cell's pruner whether to stop it (the study's, or :class:`QueryByQuery` with the
        epoch's per-query values); if so, ask the trial to stop.

        Tune's own STOP would kill the trial's actor and leak the Ray Train workers (and the
        CPUs or GPUs) it started; so the trial is asked instead (:func:`stop_file`): its loop
        returns after the current step, releasing them, and the trial reports
        ``pruned_at_epoch`` (:meth:`on_trial_result`)."""
        if trial_id not in self.live or self.metric not in result or "epoch" not in result or result.get("final"):
            return False
        cell_key, trial = self.live[trial_id]
        epoch = int(result["epoch"])
        trial.report(float(result[self.metric]), step=epoch)
        asks = self._asks_to_prune(cell_key, trial, epoch, result)  # (keeps every epoch's per-query values)
        if trial_id in self.pruning or epoch >= self.epochs[cell_key] or not asks:
            return False  # a trial that trained its last epoch is kept
        self.pruning.add(trial_id)
        marker = stop_file(self.storage, trial.user_attrs[TRAIN_RUN])
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(f"pruned after epoch {epoch}\n")
        return True

    def _asks_to_prune(self, cell_key: str, trial: optuna.Trial, epoch: int, result: dict) -> bool:
        query_by_query = self.query_by_query.get(cell_key)
        if query_by_query is None:
            return trial.should_prune()
        per_query = result.get(SELECTION_PER_QUERY)
        if not per_query:
            return False  # (a kind that reports no per-query values is never pruned by it)
        storage = self.storage
        if not query_by_query.restored:
            query_by_query.restore(storage, self.studies[cell_key])
        return query_by_query.should_prune(storage, trial.user_attrs[TRAIN_RUN], epoch, [float(v) for v in per_query])

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        if trial_id not in self.live:
            return
        cell_key, trial = self.live.pop(trial_id)
        study = self.studies[cell_key]
        if cell_key in self.query_by_query:  # the best trial's values are what later trials are compared with
            self.query_by_query[cell_key].finished(
                trial.user_attrs.get(TRAIN_RUN, ""),
                self.best_seen.get(trial_id) if not error and trial_id not in self.pruned and not (result or {}).get("failure") else None)
        if error and self.interruption is not None and self.interruption.is_set():
            return  # stopped by Ctrl-C: left RUNNING, so the next run resumes it from its checkpoint
        if not error and (result or {}).get("failure") == INPUT_FAILURE:
            return  # bad input, which stops the sweep: left RUNNING, so the next run (input fixed) runs it again
        if trial_id in self.pruned and not error:  # a recorded outcome: never retried, never a winner
            self.best_seen.pop(trial_id, None)
            trial.set_user_attr(PRUNED_TAG, self.pruned[trial_id])
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            return
        failure = (result or {}).get("failure") if not error else "error"
        best = self.best_seen.pop(trial_id, None)
        if failure or best is None:
            trial.set_user_attr(COUNTED, True)
            trial.set_user_attr(FAILURE, failure or "no result")
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
        else:
            study.tell(trial, best)
