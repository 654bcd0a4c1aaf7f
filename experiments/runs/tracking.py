"""MLflow runs: every `hyperprove evaluate` is one run holding what it takes to rerun it; the UI.

- params: the full configuration, flattened ("retriever.alpha", "evaluation.questions", ...);
- metrics: per system, "<system>.recall_at_5", "<system>.em", ...;
- tags: the git commit (and whether the tree was dirty), the LM id, the command;
- artifacts: the results table (markdown, JSON), the predictions, the index manifest and an
  environment record (package versions, Python).

The store is SQLite (MLflow 3 retired the file store) with artifacts in a folder beside it; both
come from `TrackingConfig`, so a test or a shared server is one config value away. The store
connection and the per-question traces live in `pipeline.traces`.
"""

from __future__ import annotations

import json
import os
import platform
import signal
import socket
import subprocess
import sys
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path

from modules.errors import HyperProveError, first_line
from pipeline.files import process_alive
from pipeline.serve.http import check_host, is_loopback, stop_signals, stopped_by
from pipeline.traces import connect, experiment_id, make_sqlite_folder

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


def metric_name(system: str, key: str) -> str:
    """MLflow metric names take no "@": recall@5 -> recall_at_5."""
    return f"{system}.{key.replace('@', '_at_')}"


def per_type_metrics(summary: dict) -> list[tuple[str, float]]:
    """A summary's per-type scores as flat metric keys: ("compositional.recall@2", 81.5), ..."""
    return [(f"{kind}.{key}", value) for kind, scores in summary.get("per_type", {}).items() for key, value in scores.items()]


def environment() -> dict:
    versions = {}
    for package in PACKAGES:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            continue
    return {"python": platform.python_version(), "platform": platform.platform(), "packages": versions}


HOST_TAG, PID_TAG = "hyperprove.host", "hyperprove.pid"


def worker_tags() -> dict[str, str]:
    """Which machine and process a run belongs to, so that a later run can tell one that was killed."""
    return {HOST_TAG: socket.gethostname(), PID_TAG: str(os.getpid())}


def end_abandoned_runs(mlflow, experiment: str) -> list[str]:
    """Mark KILLED the runs still RUNNING whose process on this machine no longer exists (a kill
    leaves them running forever otherwise); returns their ids."""
    client = mlflow.tracking.MlflowClient()
    ended = []
    for run in client.search_runs([experiment], "attributes.status = 'RUNNING'", max_results=1000):
        tags = run.data.tags
        if tags.get(HOST_TAG) == socket.gethostname() and tags.get(PID_TAG, "").isdigit() and not process_alive(int(tags[PID_TAG])):
            client.set_terminated(run.info.run_id, "KILLED")
            ended.append(run.info.run_id)
    return ended


@contextmanager
def tracked_run(tracking, config: dict, run_name: str, tags: dict[str, str]):
    """One MLflow run: the flat config as params, `tags` as tags (callers include the git state
    they took when their work started). Yields mlflow (the run is active; nested runs go into its
    experiment), or None when tracking is off. Runs a killed process left RUNNING are ended first."""
    if not tracking.enabled:
        yield None
        return
    mlflow = connect(tracking)
    try:
        experiment = experiment_id(mlflow, tracking)
        end_abandoned_runs(mlflow, experiment)
    except Exception as error:  # noqa: BLE001 - any store failure is one line for the user
        raise HyperProveError(f"tracking store {tracking.uri}: {type(error).__name__}: {first_line(error)}") from None
    with mlflow.start_run(experiment_id=experiment, run_name=run_name):
        mlflow.set_tags({**tags, **worker_tags()})
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
            for key, value in [*summary.items(), *per_type_metrics(summary)]
            if isinstance(value, (int, float)) and not isinstance(value, bool)
        }
        mlflow.log_metrics(metrics)
        for path in artifacts.values():
            if path.is_dir():  # the evidence-chain pages, as a folder of the run's artifacts
                mlflow.log_artifacts(str(path), artifact_path=path.name)
            else:
                mlflow.log_artifact(str(path))
        mlflow.log_dict(environment(), "environment.json")
        return active_run_id(mlflow)


def evaluation_tracker(config, log=print):
    """What `experiments.runs.evaluate.run_evaluation` takes as `track` to log an evaluation's result
    files as one MLflow run before they are moved into place; None when tracking is off."""
    from experiments.runs.evaluate import run_name

    if not config.tracking.enabled:
        return None

    def track(paths: dict[str, Path], summaries: dict[str, dict], run_tags: dict[str, str]) -> str:
        run_id = log_evaluation(config.tracking, config.to_dict(), summaries, paths, run_name(config), run_tags)
        log(f"MLflow run {run_id} in {config.tracking.uri} (experiment {config.tracking.experiment!r}; `hyperprove ui` shows it)")
        return run_id

    return track


def ui_command(tracking, host: str = "127.0.0.1", port: int = 5000, allow_remote: bool = False) -> tuple[list[str], dict[str, str]]:
    """The `mlflow server` command line (and its environment) for a lean UI over the store:
    one worker, no job execution, bound to loopback unless `allow_remote` says otherwise, and no
    artifact proxy (`--no-serve-artifacts`: MLflow's default accepts uploads from anyone into
    `./mlartifacts` of the current folder; the UI reads the runs' artifacts from their own
    location under the tracking config's folder). The server has no authentication: bound to
    another interface, anyone who reaches it reads and writes every run."""

    check_host(host, allow_remote, "the tracking store")
    make_sqlite_folder(tracking.uri)
    command = [
        sys.executable, "-m", "mlflow", "server",
        "--backend-store-uri", tracking.uri,
        "--default-artifact-root", Path(tracking.artifacts).resolve().as_uri(),
        "--no-serve-artifacts",
        "--host", host, "--port", str(port), "--workers", "1",
    ]
    return command, {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


def stop_process_group(process: subprocess.Popen, grace: float = 10.0) -> int:
    """SIGTERM to the process and every process it started (its own group), SIGKILL to what is
    left after `grace` seconds; returns its exit status."""
    for sent, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, grace)):
        try:
            os.killpg(process.pid, sent)
        except ProcessLookupError:
            break
        try:
            process.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue
    try:
        os.killpg(process.pid, signal.SIGKILL)  # a child (uvicorn) still there after its parent left
    except ProcessLookupError:
        pass
    return process.wait()


def serve_ui(tracking, host: str = "127.0.0.1", port: int = 5000, allow_remote: bool = False, log=print) -> dict:
    """Run the MLflow UI over the store until Ctrl-C, SIGTERM or SIGHUP (a closed terminal) (see
    `ui_command`). The server runs in a process group of its own, which is stopped as a whole:
    `mlflow server` starts uvicorn, which would otherwise outlive it and keep serving."""
    command, env = ui_command(tracking, host, port, allow_remote)
    url = f"http://{host}:{port}"
    if not is_loopback(host):
        log(f"warning: the tracking store is served on {host}:{port} without authentication: "
            "anyone who can reach this machine there can read and change every run")
    log(f"MLflow UI over {tracking.uri} at {url} (Ctrl-C stops it)")
    with stop_signals() as received:
        server = subprocess.Popen(command, env={**os.environ, **env}, start_new_session=True)
        try:
            code = server.wait()
        except KeyboardInterrupt:
            code = None
        finally:
            stop_process_group(server)
    if code is None:
        log(f"MLflow UI stopped ({stopped_by(received)}), with every process it started")
    elif code not in (0, -15, 130):
        raise HyperProveError(f"the MLflow server exited with status {code} (is port {port} free?)")
    return {"url": url, "tracking_uri": tracking.uri}
