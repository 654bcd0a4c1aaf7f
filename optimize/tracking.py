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

import ipaddress
import json
import logging
import os
import platform
import signal
import socket
import subprocess
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path

from modules.errors import HyperProveError, first_line
from pipeline.files import process_alive

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


class QuestionTraces:
    """One MLflow trace per question that the LM answers (`ask`, `demo`, LM `evaluate`).

    DSPy's autolog gives the spans: each module of the program (Decomposer, BridgeRewriter,
    HypergraphRetriever with its own trace in its outputs: seeds, frontier, subgraph size and
    edges, candidates, scored facts, passages; HopAnswerer, AnswerGenerator) and under them
    every LM call with its prompt, output and token usage. A root span per question holds them,
    the fallbacks become its events, and `evaluate` tags the trace with the question id, the
    gold answer, EM/F1 and whether the gold passages were reached, so the UI can filter failures.
    """

    def __init__(self, tracking, profile=None):
        import mlflow.dspy

        self.profile = profile  # the session's `pipeline.lm.LMProfile`: each call's tokens go onto its span
        if profile is not None:
            profile.listeners.append(self.record_call)
        self.mlflow = connect(tracking)
        try:
            self.mlflow.set_experiment(experiment_id=experiment_id(self.mlflow, tracking))
        except Exception as error:  # noqa: BLE001 - any store failure is one line for the user
            raise HyperProveError(f"tracking store {tracking.uri}: {type(error).__name__}: {first_line(error)}") from None
        mlflow.dspy.autolog(log_traces=True, log_traces_from_compile=False, log_traces_from_eval=False, silent=True)
        self.ids: list[str] = []

    @contextmanager
    def question(self, text: str, system: str = "hyperprove"):
        """The trace of one question; yields `finish(answer, fallbacks, tags)` to record its outcome."""
        from mlflow.entities import SpanEvent

        with self.mlflow.start_span(name=system, span_type="CHAIN") as root:
            root.set_inputs({"question": text})

            def finish(answer: str, fallbacks=(), tags: dict | None = None) -> None:
                root.set_outputs({"answer": answer})
                for note in fallbacks:
                    root.add_event(SpanEvent("fallback", attributes={"note": note}))
                self.mlflow.update_current_trace(tags={"hyperprove.system": system, **{k: str(v) for k, v in (tags or {}).items()}})

            yield finish
        self.ids.append(root.trace_id)

    def record_call(self, step: str, call) -> None:
        """One LM call's bill on the span that made it (DSPy's Predict span: the LM's own span has
        ended by the time the bill is known)."""
        span = self.mlflow.get_current_active_span()
        if span is not None:
            span.set_attributes({"hyperprove.step": step, "lm.prompt_tokens": call.prompt_tokens,
                                 "lm.cached_prompt_tokens": call.cached_prompt_tokens, "lm.completion_tokens": call.completion_tokens,
                                 "lm.seconds": round(call.seconds, 3), "lm.cache_hit": bool(call.cache_hits)})

    def close(self, run_id: str | None = None) -> int:
        """Write what is still queued, link the traces to the run that logged the results, and
        turn autolog off again; returns the number of traces."""
        import mlflow.dspy

        self.mlflow.flush_trace_async_logging()
        if run_id:
            client = self.mlflow.tracking.MlflowClient()
            for start in range(0, len(self.ids), 100):
                client.link_traces_to_run(self.ids[start:start + 100], run_id)
        mlflow.dspy.autolog(disable=True)
        if self.profile is not None and self.record_call in self.profile.listeners:
            self.profile.listeners.remove(self.record_call)
        return len(self.ids)


def run_tracked_evaluation(config, runtime=None, tags: dict | None = None, check_index=None, log=print) -> dict:
    """`hyperprove evaluate`: `experiments.evaluate.run_evaluation`, with its result files logged
    as one MLflow run (unless tracking is off) before they are moved into place."""
    from experiments.evaluate import run_evaluation, run_name

    def track(paths: dict[str, Path], summaries: dict[str, dict], run_tags: dict[str, str]) -> str:
        run_id = log_evaluation(config.tracking, config.to_dict(), summaries, paths, run_name(config), run_tags)
        log(f"MLflow run {run_id} in {config.tracking.uri} (experiment {config.tracking.experiment!r}; `hyperprove ui` shows it)")
        return run_id

    from pipeline.runtime import Runtime

    runtime = runtime or Runtime(config)
    outcome = run_evaluation(config, runtime, tags, check_index, log, track if config.tracking.enabled else None)
    if runtime.traces_started:
        outcome["traces"] = runtime.traces.close(outcome["mlflow_run"])
        log(f"{outcome['traces']} question traces in the run's experiment")
    return outcome


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def ui_command(tracking, host: str = "127.0.0.1", port: int = 5000, allow_remote: bool = False) -> tuple[list[str], dict[str, str]]:
    """The `mlflow server` command line (and its environment) for a lean UI over the store:
    one worker, no job execution, bound to loopback unless `allow_remote` says otherwise, and no
    artifact proxy (`--no-serve-artifacts`: MLflow's default accepts uploads from anyone into
    `./mlartifacts` of the current folder; the UI reads the runs' artifacts from their own
    location under the tracking config's folder). The server has no authentication: bound to
    another interface, anyone who reaches it reads and writes every run."""
    import sys

    if not is_loopback(host) and not allow_remote:
        raise HyperProveError(f"--host {host}: would serve the tracking store, unauthenticated, beyond this machine; "
                              "add --allow-remote if that is what you want")
    make_sqlite_folder(tracking.uri)
    command = [
        sys.executable, "-m", "mlflow", "server",
        "--backend-store-uri", tracking.uri,
        "--default-artifact-root", Path(tracking.artifacts).resolve().as_uri(),
        "--no-serve-artifacts",
        "--host", host, "--port", str(port), "--workers", "1",
    ]
    return command, {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


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
    stopped: list[int] = []

    def stop(number, frame):
        stopped.append(number)
        raise KeyboardInterrupt

    previous = {number: signal.signal(number, stop) for number in STOP_SIGNALS}
    server = subprocess.Popen(command, env={**os.environ, **env}, start_new_session=True)
    try:
        code = server.wait()
    except KeyboardInterrupt:
        code = None
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        stop_process_group(server)
    if code is None:
        log(f"MLflow UI stopped ({signal.Signals(stopped[0]).name if stopped else 'SIGINT'}), with every process it started")
    elif code not in (0, -15, 130):
        raise HyperProveError(f"the MLflow server exited with status {code} (is port {port} free?)")
    return {"url": url, "tracking_uri": tracking.uri}
