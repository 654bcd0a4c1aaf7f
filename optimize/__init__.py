"""Prompt compilation, Optuna sweeps, MLflow tracking and run reproduction (the optimize room)."""
