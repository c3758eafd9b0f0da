"""What would stop an EAR trial before it computes anything, found offline without preparing."""

from __future__ import annotations

from pathlib import Path

from workloads.kinds.protocol import Problems, check_collections
from workloads.models.cross_encoder import require_model_available


def ear_preflight(spec) -> list[str]:
    """Its model, its collection, its expansion source's model or file. One line each."""
    problems = Problems()
    problems.check(require_model_available, spec.model.name)
    if spec.expansion.source == "generator":
        problems.check(require_model_available, spec.expansion.model, field="expansion.model")
    if spec.expansion.source == "file" and not Path(spec.expansion.path).expanduser().is_file():
        problems.add(f"{spec.expansion.path}: expansion path: no such file")
    check_collections(problems, spec.data.collection, spec.data.test_collection)
    return problems.list()
