"""Sweeps: the grid of cells, one Optuna study per cell served to Ray Tune, the runner that resumes."""
