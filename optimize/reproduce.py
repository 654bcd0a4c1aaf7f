"""Rerunning a tracked `hyperprove evaluate` run from its record (`hyperprove reproduce RUN_ID`).

The run's `results.json` (logged as an artifact) holds the whole config and the checksums of the
data; `index_manifest.json` the index's file checksums; `program.json` the compiled program.
The rerun refuses changed data or a changed index, reruns the recorded config as a new run
tagged `hyperprove.reproduces`, and reports every metric's change (timings are wall-clock and
not compared).

A record is data someone else may have written, so it never decides where this machine writes or
whom it talks to: the results folder, the cache dir, the tracking store and the embedded model's
folder come from the local side, and a record that names an LM other than the embedded one (or
an API endpoint) is refused unless the user passes `trust_record`, because the rerun would send
every question, and the API key, there.
"""

from __future__ import annotations

import hashlib
import json
import re
import tempfile
from pathlib import Path

from modules.errors import HyperProveError
from pipeline.config import HyperProveConfig, TrackingConfig

TIMING = ("seconds_per_question", "retrieval_ms_per_question")  # wall-clock: reported, never compared
# what the LM work cost: a rerun answered from the cache spends no tokens, so reported, never compared
COST = ("prompt_tokens_per_question", "cached_prompt_tokens_per_question", "completion_tokens_per_question", "lm_cache_hits")


def recorded_evaluation(tracking: TrackingConfig, run_id: str) -> dict:
    """The results.json, index_manifest.json and compiled program (bytes) an evaluate run logged;
    the manifest and the program may be None."""
    from pipeline.tracing import connect

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
            if name not in names:
                recorded[key] = None
                continue
            try:
                recorded[key] = json.loads(Path(client.download_artifacts(run_id, name, scratch)).read_text(encoding="utf-8"))
            except (ValueError, UnicodeDecodeError, RecursionError):
                raise HyperProveError(f"run {run_id}: its {name} artifact is not valid JSON") from None
        recorded["program"] = Path(client.download_artifacts(run_id, "program.json", scratch)).read_bytes() if "program.json" in names else None
    recorded["tags"] = dict(run.data.tags)
    results = recorded["results"]
    if not isinstance(results, dict):
        raise HyperProveError(f"run {run_id}: its results.json is not a JSON object")
    for key, kind in (("config", dict), ("systems", dict), ("data_sha256", dict)):
        if not isinstance(results.get(key), kind):
            raise HyperProveError(f"run {run_id}: its results.json has no {key!r} object (not written by `hyperprove evaluate`)")
    return recorded


def same_index(recorded: dict | None, current: dict | None) -> bool:
    """Same files (by sha256) for a saved index; same corpus and counts for one built in memory."""
    if recorded is None or current is None:
        return recorded is current
    if "files" in recorded and "files" in current:
        return recorded["files"] == current["files"]
    return all(recorded.get(k) == current.get(k) for k in ("corpus_sha256", "counts", "extractor", "embedder"))


def metric_deltas(recorded: dict[str, dict], current: dict[str, dict]) -> dict[str, dict[str, float]]:
    """Per system, new minus recorded for every compared metric (timings and token costs left out)."""
    deltas: dict[str, dict[str, float]] = {}
    for system, summary in recorded.items():
        if not isinstance(summary, dict):
            continue
        now = current.get(system, {})
        for key, value in summary.items():
            if key in TIMING + COST or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            deltas.setdefault(system, {})[key] = round(float(now.get(key, float("nan"))) - float(value), 6)
    return deltas


def safe_name(name: object, fallback: str = "evaluation") -> str:
    """A recorded run name made fit to be one folder name: no separators, no leading dots."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "-", str(name or "")).strip(".-")[:80]
    return cleaned or fallback


def endpoint(config: HyperProveConfig) -> str | None:
    """Where the config's LM lives when that is not the embedded model: the model id and any API base."""
    lm = config.lm
    if lm.model is None and lm.api_base is None:
        return None
    return f"LM {lm.model or 'the embedded model'}" + (f" at {lm.api_base}" if lm.api_base else "")


def rerun_config(recorded: dict, run_id: str, tracking: TrackingConfig, out: str, cache_dir: str | None,
                 trust_record: bool = False) -> HyperProveConfig:
    """The recorded config with the local side's output folder, cache, tracking store and model
    folder; refuses a recorded LM endpoint unless `trust_record`."""
    results = recorded["results"]
    config = HyperProveConfig.from_record(results["config"], source=f"run {run_id}")
    local = HyperProveConfig()
    if not trust_record:
        named = endpoint(config)
        if named:
            raise HyperProveError(f"run {run_id} names {named}; reproducing it would send every question (and your API key) "
                                  "there: check the record, then pass --trust-record")
        config = config.with_overrides(lm={"local_model_dir": local.lm.local_model_dir}, cache_dir=local.cache_dir)
    if config.program.compiled and not results.get("program_sha256"):
        raise HyperProveError(f"run {run_id}: its config names a compiled program but the record has no program_sha256")
    return config.with_overrides(
        evaluation={"out": out, "name": f"{safe_name(results.get('name'))}-reproduce"},
        tracking={"uri": tracking.uri, "artifacts": tracking.artifacts, "experiment": tracking.experiment, "enabled": True},
        cache_dir=cache_dir,
    )


def check_data(results: dict, config: HyperProveConfig, run_id: str) -> None:
    """The questions and corpus files are here and are the ones the run was evaluated on."""
    from pipeline.files import sha256_file

    for kind in ("questions", "corpus"):
        path = getattr(config.evaluation, kind)
        if not path or not Path(path).is_file():
            raise HyperProveError(f"{path}: the {kind} file of run {run_id} is not here")
        if sha256_file(path) != results["data_sha256"].get(kind):
            raise HyperProveError(f"{path}: differs from the {kind} run {run_id} was evaluated on (sha256 mismatch); not reproducing")


def reproduce(run_id: str, tracking: TrackingConfig, out: str | None = None, cache_dir: str | None = None,
              trust_record: bool = False, make_runtime=None, log=print) -> dict:
    """Rerun run `run_id` of the tracking store; returns the new run, its folder and the deltas.
    `make_runtime(config)` gives the LM and embedder of the rerun (default: the configured ones)."""
    from experiments.evaluate import run_evaluation
    from experiments.harness import timestamp
    from optimize.tracking import evaluation_tracker
    from pipeline.provenance import git_state

    recorded = recorded_evaluation(tracking, run_id)
    results = recorded["results"]
    out = out or str(Path(".hyperprove") / "results" / f"{safe_name(results.get('name'))}-reproduce-{timestamp()}")
    config = rerun_config(recorded, run_id, tracking, out, cache_dir, trust_record)
    check_data(results, config, run_id)
    if results.get("git_commit"):
        now = git_state().get("git_commit")
        if now != results["git_commit"]:
            log(f"note: run {run_id} was made at commit {str(results['git_commit'])[:10]}, this is {str(now)[:10]}")
    shown = config.to_dict()
    log(f"reproducing run {run_id} with this config:")
    for section in ("evaluation", "retriever", "index", "lm", "program"):
        log(f"  {section}: {json.dumps(shown[section])}")
    log(f"  cache_dir: {json.dumps(shown['cache_dir'])}")

    def check_index(manifest: dict | None) -> None:
        if not same_index(recorded["index_manifest"], manifest):
            raise HyperProveError(f"the index differs from the one run {run_id} used (index manifest checksums); not reproducing")

    with tempfile.TemporaryDirectory() as scratch:
        if results.get("program_sha256"):  # rerun with the compiled program the run logged
            program = recorded["program"]
            if program is None or hashlib.sha256(program).hexdigest() != results["program_sha256"]:
                raise HyperProveError(f"run {run_id}: its compiled program.json artifact is missing or differs from the recorded sha256")
            (Path(scratch) / "program.json").write_bytes(program)
            config = config.with_overrides(program={"compiled": str(Path(scratch) / "program.json")})
        runtime = make_runtime(config) if make_runtime else None
        outcome = run_evaluation(config, runtime, tags={"hyperprove.reproduces": run_id}, check_index=check_index, log=log,
                                 track=evaluation_tracker(config, log))
    deltas = metric_deltas(results["systems"], outcome["retrievers"])
    changed = {system: {k: d for k, d in values.items() if d != 0} for system, values in deltas.items()}
    changed = {system: values for system, values in changed.items() if values}
    for system, values in changed.items():
        log(f"{system}: " + ", ".join(f"{key} {delta:+.4g}" for key, delta in values.items()))
    if not changed:
        log(f"reproduced run {run_id}: every metric identical (wall-clock times and token costs are not compared)")
    return {"run": run_id, "reproduction": outcome["mlflow_run"], "out": outcome["out"], "identical": not changed, "deltas": deltas}
