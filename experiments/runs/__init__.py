"""Evaluation runs: running and recording one, spreading it over Ray, its results folder, MLflow tracking, reproduction and the report."""
