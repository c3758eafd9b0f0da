"""MLflow tracking: runs found or created by identity, the sweep/cell/trial hierarchy, evaluations.

Default store: SQLite in the working directory (``.orchestrate/mlflow.db``, artifacts in
``.orchestrate/mlartifacts``); ``--tracking-uri`` or ``$MLFLOW_TRACKING_URI`` override it.
SQLite locks under concurrent writers, so workers never write: they report to Ray, and the
driver logs. A run's identity is its ``trial_key`` tag (see :mod:`orchestrator.core.schema`),
so a rerun finds its run instead of creating a second one.

The hierarchy (MLflow's ``parentRunId``): a sweep run (kind ``sweep``, home of the reports)
parents one run per cell (kind ``cell``), which parents one run per trial (kind ``trial``);
each supervised selector a sweep trains is a run of kind ``selector`` under the sweep run.
``orchestrate run`` writes trial and selector runs without parents.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlparse
from urllib.request import url2pathname

from orchestrator.core import schema
from workloads.core.errors import InputError
from workloads.core.logs import LEVEL_ENV
from workloads.evaluation import Evaluation
from workloads.kinds import TRIAL_KINDS
from workloads.training import PROGRESS_FILE


def default_tracking_uri() -> str:
    return f"sqlite:///{Path.cwd() / '.orchestrate' / 'mlflow.db'}"


def resolve_tracking_uri(cli_value: str | None) -> str:
    return cli_value or os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri()


# Schemes MLflow's client takes for a tracking store (SQLAlchemy databases, a server, its file store).
TRACKING_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql", "http", "https", "file", "databricks")
SERVER_TIMEOUT_SECONDS = 5.0


def sqlite_path(uri: str) -> Path | None:
    return Path(uri.removeprefix("sqlite:///")) if uri.startswith("sqlite:///") else None


def _file_path(uri: str) -> Path:
    """The local path of a ``file:`` URI (percent-decoded, as ``Path.as_uri`` wrote it)."""
    return Path(url2pathname(urlparse(uri).path))


# A writer killed inside a transaction (a driver's SIGKILL) leaves a hot journal beside the
# database; a read-only connection cannot roll it back and says "attempt to write a readonly
# database". The file is a database: SQLite rolls the journal back on the next writable open.
# (tests/sweep/test_chaos.py found a rerun after a driver's SIGKILL refused this way.)
HOT_JOURNAL = sqlite3.SQLITE_READONLY | (3 << 8)  # SQLITE_READONLY_ROLLBACK


def check_sqlite_file(path: Path, what: str) -> None:
    """A SQLite file that cannot be read as a database is one line naming it (it stays untouched)."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as connection:
            connection.execute("select count(*) from sqlite_master").fetchone()
    except sqlite3.DatabaseError as exc:
        if getattr(exc, "sqlite_errorcode", None) == HOT_JOURNAL:
            return
        raise InputError(path, f"cannot read this {what} ({exc}): it is left as it is; move it away to start afresh") from None


def check_tracking_uri(cli_value: str | None) -> str:
    """The tracking URI of ``--tracking-uri`` (or $MLFLOW_TRACKING_URI, or SQLite in
    ``.orchestrate/``), checked without writing anything: a scheme MLflow takes, a SQLite file
    that is a database, a server that answers within seconds."""
    uri = resolve_tracking_uri(cli_value)
    scheme = uri.split(":", 1)[0].split("+", 1)[0].lower() if ":" in uri else ""
    if scheme not in TRACKING_SCHEMES:
        raise InputError(uri, f"not a tracking URI MLflow takes (schemes: {', '.join(TRACKING_SCHEMES)}; e.g. "
                              "sqlite:///path/mlflow.db or http://host:5000)")
    path = sqlite_path(uri)
    if path is not None and path.exists() and path.stat().st_size > 0:
        check_sqlite_file(path, "MLflow store")
    elif scheme in ("http", "https"):
        check_server(uri)
    return uri


def open_tracker(cli_value: str | None, write: bool = True) -> Tracker | None:
    """The tracking store, checked first (:func:`check_tracking_uri`). ``write=False`` (a command
    that only reads) creates nothing and returns None when a SQLite store does not exist yet or
    is an empty file (a read must not turn it into a store)."""
    uri = check_tracking_uri(cli_value)
    path = sqlite_path(uri)
    if path is not None and not (path.exists() and path.stat().st_size > 0):
        if not write:
            return None
        path.parent.mkdir(parents=True, exist_ok=True)
    tracker = Tracker(uri)
    if write and path is not None and path.exists():
        for experiment in tracker.client.search_experiments():  # a moved store is written where it is now
            tracker.follow_moved_store(experiment)
    return tracker


def check_server(uri: str) -> None:
    """An MLflow tracking server that does not answer its health check within seconds is one line
    (MLflow's client would retry for minutes)."""
    try:
        with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=SERVER_TIMEOUT_SECONDS) as response:
            response.read(64)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise InputError(uri, f"no MLflow tracking server answers there within {SERVER_TIMEOUT_SECONDS:.0f} s ({reason})") from None


def _named_client(tracking_uri: str):
    """An ``MlflowClient`` that stores metrics under their grouped names and hands runs back
    under the code's (:func:`schema.stored_metric_name`): every read and write of the project
    goes through it, so no caller ever sees two names for one metric, and stores written with
    flat names read the same."""
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    def read(run):
        # RunData has no setter: its metrics dict is replaced under the code's names (MLflow's own
        # attribute, the dict its ``metrics`` property returns). A run of an older store written
        # again since (a cell tested again, a trial resumed) holds both names: the grouped one is
        # the newer value, whatever order the database returns them in.
        items = sorted(run.data.metrics.items(), key=lambda item: "/" in item[0])
        run.data._metrics = {schema.code_metric_name(k): v for k, v in items}
        return run

    class NamedMetricsClient(MlflowClient):
        def get_run(self, run_id):
            return read(super().get_run(run_id))

        def search_runs(self, *args, **kwargs):
            runs = super().search_runs(*args, **kwargs)
            for run in runs:
                read(run)
            return runs

        def log_batch(self, run_id, metrics=(), params=(), tags=(), synchronous=None):
            stored = [Metric(schema.stored_metric_name(m.key), m.value, m.timestamp, m.step) for m in metrics]
            return super().log_batch(run_id, metrics=stored, params=params, tags=tags, synchronous=synchronous)

        def log_metric(self, run_id, key, value, *args, **kwargs):
            return super().log_metric(run_id, schema.stored_metric_name(key), value, *args, **kwargs)

        def get_metric_history(self, run_id, key):
            history = list(super().get_metric_history(run_id, schema.stored_metric_name(key)))
            if schema.stored_metric_name(key) != key:  # and what an older store wrote under the flat name
                history += super().get_metric_history(run_id, key)
            return [Metric(key, m.value, m.timestamp, m.step) for m in sorted(history, key=lambda m: (m.step, m.timestamp))]

    return NamedMetricsClient(tracking_uri=tracking_uri)


class Tracker:
    """A thin layer over ``MlflowClient`` for the runs rerank-lab writes."""

    def __init__(self, tracking_uri: str):
        os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # per-file bars drown the report
        import mlflow.tracking  # noqa: F401  (first: importing MLflow sets its logger's level)

        if os.environ.get(LEVEL_ENV, "INFO") != "DEBUG":  # "Creating initial MLflow database tables..." and the like
            logging.getLogger("mlflow").setLevel(logging.WARNING)

        self.uri = tracking_uri
        self.client = _named_client(tracking_uri)
        self._homes: dict[str, tuple[Path, Path] | None] = {}  # experiment id: store_homes

    # ------------------------------------------------------------------ experiments and runs

    def experiment_id(self, name: str) -> str:
        """The experiment ``name`` (created if needed), marked as model development so MLflow 3's
        UI opens it on its runs table rather than on a GenAI traces overview."""
        experiment = self.client.get_experiment_by_name(name)
        if experiment is None:
            artifact_location = None
            if self.uri.startswith("sqlite:///"):
                artifact_location = (Path(self.uri.removeprefix("sqlite:///")).parent / "mlartifacts" / name).resolve().as_uri()
            experiment_id = self.client.create_experiment(name, artifact_location=artifact_location)
        else:
            experiment_id = experiment.experiment_id
            self.follow_moved_store(experiment)  # what is written next goes into the store where it is
            if experiment.tags.get(schema.EXPERIMENT_KIND_TAG) == schema.EXPERIMENT_KIND:
                return experiment_id
        self.client.set_experiment_tag(experiment_id, schema.EXPERIMENT_KIND_TAG, schema.EXPERIMENT_KIND)
        return experiment_id

    def find_run(self, experiment_id: str | None, trial_key: str, status: str | None = None):
        """The run with this identity in ``experiment_id`` (None: in any experiment of the store)."""
        query = f"tags.`{schema.TRIAL_KEY_TAG}` = '{trial_key}'"
        if status:
            query += f" and attributes.status = '{status}'"
        experiments = [experiment_id] if experiment_id else [e.experiment_id for e in self.client.search_experiments()]
        runs = self.client.search_runs(experiments, filter_string=query, max_results=10)
        return runs[0] if runs else None

    def runs_of_kind(self, experiment_id: str, kind: str) -> list:
        return self.client.search_runs([experiment_id], filter_string=f"tags.`{schema.KIND_TAG}` = '{kind}'",
                                       max_results=50_000)

    def start_trial_run(self, experiment_id: str, run_name: str, trial_key: str, params: dict[str, str],
                        tags: dict[str, str], kind: str = schema.TRIAL) -> str:
        """Reuse the unfinished run of this trial (or selector) if there is one (a crashed
        attempt), else create it."""
        previous = self.find_run(experiment_id, trial_key)
        if previous is not None and previous.info.status != "FINISHED":
            run_id = previous.info.run_id
            self.client.update_run(run_id, status="RUNNING")
            self.resumed(run_id)
            stale = {k: v for k, v in tags.items() if previous.data.tags.get(k) != v}
            if stale:  # what describes this attempt (a resumed trial's Optuna number, its data)
                self.set_tags(run_id, stale)
            return run_id
        run = self.client.create_run(experiment_id, run_name=run_name,
                                     tags={schema.TRIAL_KEY_TAG: trial_key, schema.KIND_TAG: kind, **tags})
        from mlflow.entities import Param

        items = list(params.items())
        for start in range(0, len(items), 100):
            self.client.log_batch(run.info.run_id, params=[Param(k, v) for k, v in items[start:start + 100]])
        return run.info.run_id

    def sweep_run(self, experiment_id: str, sweep_name: str) -> str:
        """The sweep's own run, parent of its cell runs and home of its reports (found or created)."""
        key = f"sweep:{sweep_name}"
        existing = self.find_run(experiment_id, key)
        if existing is not None:
            return existing.info.run_id
        run = self.client.create_run(experiment_id, run_name=f"sweep {sweep_name}", tags={
            schema.TRIAL_KEY_TAG: key, schema.KIND_TAG: schema.SWEEP, schema.SWEEP_TAG: sweep_name})
        return run.info.run_id

    def cell_run(self, experiment_id: str, sweep_name: str, cell_key: str, axes: dict[str, str], is_baseline: bool,
                 description: dict) -> str:
        """A cell's run under the sweep run (found or created; identity: the cell key)."""
        root = self.sweep_run(experiment_id, sweep_name)
        tags = {schema.PARENT_TAG: root, schema.CELL_TAG: cell_key, schema.SWEEP_TAG: sweep_name, **axes}
        existing = self.find_run(experiment_id, cell_key)
        if existing is not None:
            stale = {k: v for k, v in tags.items() if existing.data.tags.get(k) != v}
            if stale:  # a store written before sweep runs, or before cell runs carried every axis
                self.set_tags(existing.info.run_id, stale)
            return existing.info.run_id
        run = self.client.create_run(experiment_id, run_name="/".join(axes[a] for a in schema.GRID_AXES if a in axes), tags={
            schema.TRIAL_KEY_TAG: cell_key, schema.KIND_TAG: schema.CELL, schema.BASELINE_TAG: str(is_baseline).lower(), **tags})
        self.log_json(run.info.run_id, "", "cell.json", description)
        return run.info.run_id

    # ------------------------------------------------------------------ writing

    def log_metrics(self, run_id: str, metrics: dict[str, float], step: int = 0, prefix: str = "") -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(f"{prefix}{k}", float(v), now, step) for k, v in metrics.items()]
        for start in range(0, len(items), 1000):
            self.client.log_batch(run_id, metrics=items[start:start + 1000])

    def set_tags(self, run_id: str, tags: dict[str, str]) -> None:
        for key, value in tags.items():
            self.client.set_tag(run_id, key, value)

    def describe(self, run_id: str, markdown: str) -> None:
        """The run's description in the MLflow UI."""
        self.client.set_tag(run_id, schema.NOTE_TAG, markdown)

    def log_json(self, run_id: str, artifact_path: str, name: str, payload) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / name
            path.write_text(json.dumps(payload, indent=1, sort_keys=True))
            self.client.log_artifact(run_id, str(path), artifact_path)

    def log_text(self, run_id: str, text: str, artifact_file: str) -> None:
        self.client.log_text(run_id, text, artifact_file)

    def log_file(self, run_id: str, path: Path, artifact_path: str) -> None:
        self.client.log_artifact(run_id, str(path), artifact_path)

    def log_model(self, run_id: str, checkpoint: Path) -> None:
        """A checkpoint's model (weights, tokenizer, config) as the run's artifact ``model``,
        without the resumable training state (optimizer, schedule: twice the model's size)."""
        left_out = {PROGRESS_FILE, *(kind.state_file for kind in TRIAL_KINDS.values())}
        for path in sorted(Path(checkpoint).iterdir()):
            if path.is_file() and path.name not in left_out:
                self.client.log_artifact(run_id, str(path), schema.MODEL_ARTIFACT)

    def log_new_params(self, run_id: str, params: dict[str, str]) -> dict[str, str]:
        """Log the params the run does not hold yet; MLflow never changes a logged param, so
        returns those it holds with another value (the caller says so)."""
        from mlflow.entities import Param

        held = self.client.get_run(run_id).data.params
        new = [Param(k, v) for k, v in params.items() if k not in held]
        for start in range(0, len(new), 100):
            self.client.log_batch(run_id, params=new[start:start + 100])
        return {k: held[k] for k, v in params.items() if k in held and held[k] != v}

    def log_evaluation(self, run_id: str, prefix: str, evaluation: Evaluation) -> None:
        """Aggregates as ``<prefix><measure>`` and the per-query values as ``per_query/<prefix>.json``."""
        self.log_metrics(run_id, evaluation.aggregate, prefix=prefix)
        self.log_json(run_id, "per_query", f"{prefix.rstrip('_')}.json",
                      {"relevance_level": evaluation.relevance_level, "num_queries": evaluation.num_queries,
                       "aggregate": evaluation.aggregate, "per_query": evaluation.per_query})

    def fail(self, run_id: str, failure: str, error: BaseException | str | None = None) -> None:
        """Mark a run FAILED with why (never reported as complete)."""
        tags = {schema.FAILURE_TAG: failure}
        if error is not None:
            text = str(error).strip()
            tags[schema.ERROR_TAG] = (text.splitlines()[-1] if text else type(error).__name__)[:500]
        self.set_tags(run_id, tags)
        self.finish(run_id, "FAILED")

    def resumed(self, run_id: str) -> None:
        """A run taken up again (after Ctrl-C, or an error that stopped the command): no longer
        marked interrupted or failed, so a run that then finishes says nothing of the earlier attempt."""
        tags = self.client.get_run(run_id).data.tags
        for tag in (schema.INTERRUPTED_TAG, schema.FAILURE_TAG, schema.ERROR_TAG):
            if tag in tags:
                self.client.delete_tag(run_id, tag)

    def finish(self, run_id: str, status: str = "FINISHED") -> None:
        self.client.set_terminated(run_id, status=status)

    def run_artifacts(self, run):
        """The artifact repository of ``run`` (an MLflow Run): its files read where its artifact URI
        says. MLflow's client resolves the run again for every listing and download (``runs:/``,
        and the models logged with it), which for the report's per-query files of doc19's 255
        cells was 7,144 run reads, 57 of its 95 seconds."""
        from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

        return get_artifact_repository(self.artifact_uri(run), tracking_uri=self.uri)

    # ------------------------------------------------------------------ a store that moved
    # MLflow records absolute artifact paths (the experiment's root, each run's URI): a SQLite
    # store moved or copied with its folder (rsync from a cluster's volume, a renamed or copied
    # project) would read its artifacts where they were, or find none. Its experiments' roots are
    # ``<folder of mlflow.db>/mlartifacts/<name>`` (experiment_id), so the folder it was in is known.

    def store_homes(self, experiment) -> tuple[Path, Path] | None:
        """For a SQLite store: the folder its database was in when ``experiment`` was created, and
        the folder it is in now (equal unless the store moved); None for another store or root."""
        db = sqlite_path(self.uri)
        location = getattr(experiment, "artifact_location", None) or ""
        if db is None or not location.startswith("file:"):
            return None
        root = _file_path(location)
        if root.parent.name != "mlartifacts":
            return None
        return root.parent.parent, db.resolve().parent

    def artifact_uri(self, run) -> str:
        """Where ``run``'s artifacts are read: where MLflow recorded them, or, in a SQLite store
        moved since, at the same place under the store as it is now (a copy reads its own files
        even while the original's exist). A moved database without its artifacts is one line."""
        recorded = run.info.artifact_uri
        experiment_id = run.info.experiment_id
        if experiment_id not in self._homes:
            self._homes[experiment_id] = self.store_homes(self.client.get_experiment(experiment_id))
        homes = self._homes[experiment_id]
        if homes is None or homes[0] == homes[1] or not recorded.startswith("file:"):
            return recorded
        then, now = homes
        path = _file_path(recorded)
        if not path.is_relative_to(then):
            return recorded
        moved = now / path.relative_to(then)
        if moved.exists() or (now / "mlartifacts").is_dir():
            return moved.as_uri()
        if path.exists():
            return recorded  # a database copied without its artifacts: the original's are the same files
        raise InputError(sqlite_path(self.uri), f"this MLflow store was moved from {then}, without its artifacts: neither "
                                                f"{then / 'mlartifacts'} nor {now / 'mlartifacts'} exists; copy the "
                                                f"mlartifacts folder that was beside it to {now}")

    def follow_moved_store(self, experiment) -> bool:
        """Before writing to ``experiment`` of a SQLite store moved since: its artifact root and
        its runs' artifact URIs are rewritten to the store's folder now, so that new artifacts go
        into the store rather than where it was. MLflow has no API to change an artifact location:
        the two columns are updated in its database, in one transaction. Returns whether it did."""
        homes = self.store_homes(experiment)
        if homes is None or homes[0] == homes[1]:
            return False
        old, new = (homes[0] / "mlartifacts").as_uri(), (homes[1] / "mlartifacts").as_uri()
        with contextlib.closing(sqlite3.connect(sqlite_path(self.uri), timeout=60)) as db, db:
            db.execute("update experiments set artifact_location = ? || substr(artifact_location, ?) where experiment_id = ? "
                       "and substr(artifact_location, 1, ?) = ?", (new, len(old) + 1, experiment.experiment_id, len(old), old))
            db.execute("update runs set artifact_uri = ? || substr(artifact_uri, ?) where experiment_id = ? "
                       "and substr(artifact_uri, 1, ?) = ?", (new, len(old) + 1, experiment.experiment_id, len(old), old))
        self._homes.pop(experiment.experiment_id, None)
        owner = experiment.tags.get(schema.SWEEP_FILE_TAG)
        if owner:  # the sweep file beside the store now (what check_owner takes a moved store's owner to be)
            beside = os.path.normpath(homes[1] / os.path.relpath(owner, homes[0]))
            self.client.set_experiment_tag(experiment.experiment_id, schema.SWEEP_FILE_TAG, beside)
        logging.getLogger("rerank_lab.tracking").info("MLflow store %s: moved from %s; experiment '%s' now keeps its "
                                                      "artifacts in %s", self.uri, homes[0], experiment.name, new)
        return True

    def run_metrics(self, run_id: str) -> dict[str, float]:
        return dict(self.client.get_run(run_id).data.metrics)


def mark_pruned(tracker: Tracker, run_id: str, epoch: int, wall: float | None = None) -> None:
    """A pruned trial's run: KILLED (MLflow's "stopped"), tagged with the epoch it stopped after."""
    tracker.set_tags(run_id, {schema.PRUNED_TAG: str(epoch)})
    if wall is not None:
        tracker.log_metrics(run_id, {schema.TIME_TRIAL: wall})
    tracker.finish(run_id, "KILLED")
