"""Datasets, metrics, retrieval baselines, evaluation drivers and benchmarks."""
