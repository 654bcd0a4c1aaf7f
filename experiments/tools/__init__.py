"""Tools for results and data, each run as `python -m experiments.tools.NAME` from the repository root."""
