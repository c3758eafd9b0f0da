"""The data plane of rerank-lab: data, first stage, models, losses, training, evaluation.

Nothing here imports ``orchestrator``: every workload takes a typed spec and returns
metrics and artifacts, so it runs and is tested without Ray or MLflow.
"""
