"""Reports: a sweep read back from MLflow (cross-checked), paper tables, figures, run comparisons."""
