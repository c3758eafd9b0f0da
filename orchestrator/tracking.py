"""MLflow tracking: one trial = one MLflow run, written from the driver process only.

Default store: SQLite in the working directory (``.orchestrate/mlflow.db``, artifacts in
``.orchestrate/mlartifacts``); ``--tracking-uri`` or ``$MLFLOW_TRACKING_URI`` override it.
SQLite locks under concurrent writers, so workers never write: they report to Ray, and the
driver logs. A run's identity is its ``trial_key`` tag (a hash of the resolved spec), so a
rerun finds the finished run instead of creating a second one.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from workloads.evaluation import Evaluation

TRIAL_KEY_TAG = "rerank_lab.trial_key"
KIND_TAG = "rerank_lab.kind"


def default_tracking_uri() -> str:
    root = Path.cwd() / ".orchestrate"
    root.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{root / 'mlflow.db'}"


def resolve_tracking_uri(cli_value: str | None) -> str:
    return cli_value or os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri()


class Tracker:
    """A thin layer over ``MlflowClient`` for the runs rerank-lab writes."""

    def __init__(self, tracking_uri: str):
        os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # per-file bars drown the report
        from mlflow.tracking import MlflowClient

        self.uri = tracking_uri
        self.client = MlflowClient(tracking_uri=tracking_uri)

    def experiment_id(self, name: str) -> str:
        experiment = self.client.get_experiment_by_name(name)
        if experiment is not None:
            return experiment.experiment_id
        artifact_location = None
        if self.uri.startswith("sqlite:///"):
            artifact_location = (Path(self.uri.removeprefix("sqlite:///")).parent / "mlartifacts" / name).resolve().as_uri()
        return self.client.create_experiment(name, artifact_location=artifact_location)

    def find_run(self, experiment_id: str | None, trial_key: str, status: str | None = None):
        """The run with this identity in ``experiment_id`` (None: in any experiment of the store)."""
        query = f"tags.`{TRIAL_KEY_TAG}` = '{trial_key}'"
        if status:
            query += f" and attributes.status = '{status}'"
        experiments = [experiment_id] if experiment_id else [e.experiment_id for e in self.client.search_experiments()]
        runs = self.client.search_runs(experiments, filter_string=query, max_results=10)
        return runs[0] if runs else None

    def start_trial_run(self, experiment_id: str, run_name: str, trial_key: str, params: dict[str, str], tags: dict[str, str]) -> str:
        """Reuse the unfinished run of this trial if there is one (a crashed attempt), else create it."""
        previous = self.find_run(experiment_id, trial_key)
        if previous is not None and previous.info.status != "FINISHED":
            run_id = previous.info.run_id
            self.client.update_run(run_id, status="RUNNING")
        else:
            run = self.client.create_run(experiment_id, run_name=run_name, tags={TRIAL_KEY_TAG: trial_key, KIND_TAG: "trial", **tags})
            run_id = run.info.run_id
            from mlflow.entities import Param

            items = list(params.items())
            for start in range(0, len(items), 100):
                self.client.log_batch(run_id, params=[Param(k, v) for k, v in items[start:start + 100]])
        return run_id

    def log_metrics(self, run_id: str, metrics: dict[str, float], step: int = 0, prefix: str = "") -> None:
        from mlflow.entities import Metric
        import time

        now = int(time.time() * 1000)
        self.client.log_batch(run_id, metrics=[Metric(f"{prefix}{k}", float(v), now, step) for k, v in metrics.items()])

    def set_tags(self, run_id: str, tags: dict[str, str]) -> None:
        for key, value in tags.items():
            self.client.set_tag(run_id, key, value)

    def log_json(self, run_id: str, artifact_path: str, name: str, payload) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / name
            path.write_text(json.dumps(payload, indent=1, sort_keys=True))
            self.client.log_artifact(run_id, str(path), artifact_path)

    def log_file(self, run_id: str, path: Path, artifact_path: str) -> None:
        self.client.log_artifact(run_id, str(path), artifact_path)

    def log_evaluation(self, run_id: str, prefix: str, evaluation: Evaluation) -> None:
        self.log_metrics(run_id, evaluation.aggregate, prefix=prefix)
        self.log_json(run_id, "per_query", f"{prefix.rstrip('_')}.json",
                      {"relevance_level": evaluation.relevance_level, "num_queries": evaluation.num_queries,
                       "aggregate": evaluation.aggregate, "per_query": evaluation.per_query})

    def finish(self, run_id: str, status: str = "FINISHED") -> None:
        self.client.set_terminated(run_id, status=status)

    def run_metrics(self, run_id: str) -> dict[str, float]:
        return dict(self.client.get_run(run_id).data.metrics)
