"""MLflow tracking: every `hyperprove evaluate` is one run holding what it takes to rerun it.

- params: the full configuration, flattened ("retriever.alpha", "evaluation.questions", ...);
- metrics: per system, "<system>.recall_at_5", "<system>.em", ...;
- tags: the git commit (and whether the tree was dirty), the LM id, the command;
- artifacts: the results table (markdown, JSON), the predictions, the index manifest and an
  environment record (package versions, Python).

The store is SQLite (MLflow 3 retired the file store) with artifacts in a folder beside it; both
come from `TrackingConfig`, so a test or a shared server is one config value away.
"""

from __future__ import annotations

import json
import logging
import platform
import subprocess
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path

from modules.errors import HyperProveError

PACKAGES = ("dspy", "mlflow", "optuna", "faiss-cpu", "sentence-transformers", "torch", "numpy", "scipy", "xllamacpp", "bm25s")


def flat_params(values: dict, prefix: str = "") -> dict[str, str]:
    """Nested config -> {"section.field": "value"}; lists and None as JSON."""
    flat: dict[str, str] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flat_params(value, prefix=f"{name}."))
        else:
            flat[name] = value if isinstance(value, str) else json.dumps(value)
    return flat


def make_sqlite_folder(uri: str) -> None:
    """A local SQLite store's folder must exist before MLflow or Optuna opens it."""
    if uri.startswith("sqlite:///"):
        Path(uri[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)


def metric_name(system: str, key: str) -> str:
    """MLflow metric names take no "@": recall@5 -> recall_at_5."""
    return f"{system}.{key.replace('@', '_at_')}"


def git_state(directory: Path) -> dict[str, str]:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=directory, capture_output=True, text=True, timeout=10).stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return {}
    return {"git_commit": commit, "git_dirty": str(dirty).lower()} if commit else {}


def environment() -> dict:
    versions = {}
    for package in PACKAGES:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            continue
    return {"python": platform.python_version(), "platform": platform.platform(), "packages": versions}


def experiment_id(mlflow, tracking) -> str:
    experiment = mlflow.get_experiment_by_name(tracking.experiment)
    if experiment is not None:
        return experiment.experiment_id
    return mlflow.create_experiment(tracking.experiment, artifact_location=Path(tracking.artifacts).resolve().as_uri())


def connect(tracking):
    """mlflow, pointed at the configured store (its folder created for a local SQLite path)."""
    import mlflow

    for name in ("mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)
    make_sqlite_folder(tracking.uri)
    mlflow.set_tracking_uri(tracking.uri)
    return mlflow


@contextmanager
def tracked_run(tracking, config: dict, run_name: str, tags: dict[str, str]):
    """One MLflow run: the flat config as params, `tags` as tags (callers include the git state
    they took when their work started). Yields mlflow (the run is active; nested runs go into its
    experiment), or None when tracking is off."""
    if not tracking.enabled:
        yield None
        return
    mlflow = connect(tracking)
    try:
        experiment = experiment_id(mlflow, tracking)
    except Exception as error:  # noqa: BLE001 - any store failure is one line for the user
        raise HyperProveError(f"tracking store {tracking.uri}: {type(error).__name__}: {error}") from None
    with mlflow.start_run(experiment_id=experiment, run_name=run_name):
        mlflow.set_tags(tags)
        mlflow.log_params(flat_params(config))
        yield mlflow


def active_run_id(mlflow) -> str:
    return mlflow.active_run().info.run_id


def log_evaluation(tracking, config: dict, systems: dict[str, dict], artifacts: dict[str, Path], run_name: str, tags: dict[str, str]) -> str:
    """One MLflow run for one evaluation; returns its run id."""
    with tracked_run(tracking, config, run_name, {"hyperprove.kind": "evaluate", **tags}) as mlflow:
        metrics = {
            metric_name(system, key): float(value)
            for system, summary in systems.items()
            for key, value in summary.items()
            if isinstance(value, (int, float)) and not isinstance(value, bool)
        }
        mlflow.log_metrics(metrics)
        for path in artifacts.values():
            mlflow.log_artifact(str(path))
        mlflow.log_dict(environment(), "environment.json")
        return active_run_id(mlflow)


def ui_command(tracking, host: str = "127.0.0.1", port: int = 5000) -> tuple[list[str], dict[str, str]]:
    """The `mlflow server` command line (and its environment) for a lean UI over the store:
    one worker, no job execution, bound to loopback unless told otherwise."""
    import sys

    make_sqlite_folder(tracking.uri)
    command = [
        sys.executable, "-m", "mlflow", "server",
        "--backend-store-uri", tracking.uri,
        "--default-artifact-root", Path(tracking.artifacts).resolve().as_uri(),
        "--host", host, "--port", str(port), "--workers", "1",
    ]
    return command, {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


# --- reproducing a run ---------------------------------------------------------------------------
TIMING = ("seconds_per_question", "retrieval_ms_per_question")  # wall-clock: reported, never compared


def recorded_evaluation(tracking, run_id: str) -> dict:
    """The results.json, index_manifest.json and compiled program (bytes) an evaluate run logged;
    the manifest and the program may be None."""
    import tempfile

    connect(tracking)
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking.uri)
    try:
        run = client.get_run(run_id)
    except MlflowException:
        raise HyperProveError(f"run {run_id}: not in the tracking store {tracking.uri}") from None
    if run.data.tags.get("hyperprove.kind") != "evaluate":
        raise HyperProveError(f"run {run_id}: not a `hyperprove evaluate` run")
    with tempfile.TemporaryDirectory() as scratch:
        names = {artifact.path for artifact in client.list_artifacts(run_id)}
        if "results.json" not in names:
            raise HyperProveError(f"run {run_id}: its results.json artifact is missing")
        recorded = {}
        for key, name in (("results", "results.json"), ("index_manifest", "index_manifest.json")):
            recorded[key] = json.loads(Path(client.download_artifacts(run_id, name, scratch)).read_text()) if name in names else None
        recorded["program"] = Path(client.download_artifacts(run_id, "program.json", scratch)).read_bytes() if "program.json" in names else None
    recorded["tags"] = dict(run.data.tags)
    return recorded


def same_index(recorded: dict | None, current: dict | None) -> bool:
    """Same files (by sha256) for a saved index; same corpus and counts for one built in memory."""
    if recorded is None or current is None:
        return recorded is current
    if "files" in recorded and "files" in current:
        return recorded["files"] == current["files"]
    return all(recorded.get(k) == current.get(k) for k in ("corpus_sha256", "counts", "extractor", "embedder"))


def metric_deltas(recorded: dict[str, dict], current: dict[str, dict]) -> dict[str, dict[str, float]]:
    """Per system, new minus recorded for every compared metric (timings left out)."""
    deltas: dict[str, dict[str, float]] = {}
    for system, summary in recorded.items():
        now = current.get(system, {})
        for key, value in summary.items():
            if key in TIMING or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            deltas.setdefault(system, {})[key] = round(float(now.get(key, float("nan"))) - float(value), 6)
    return deltas
