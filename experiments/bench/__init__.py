"""Benchmark and check scripts, each run as `python -m experiments.bench.NAME` from the repository root."""
