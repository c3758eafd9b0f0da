"""rerank-lab's control plane: ``core`` (configuration, the run-store schema, tracking, Ray
execution, the one trial lifecycle), ``sweep`` (grid, per-cell Optuna studies on Ray Tune,
the sweep runner) and ``report`` (read-back, tables, figures, compare)."""
