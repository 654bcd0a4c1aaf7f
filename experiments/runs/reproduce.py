"""Rerunning a `hyperprove evaluate` run from its record (`hyperprove reproduce RUN_ID` for a
tracked run, `hyperprove reproduce RESULTS_FOLDER` for a results folder, a committed one too).

The run's `results.json` holds the whole config and the checksums of the data;
`index_manifest.json` the index's file checksums; `program.json` the compiled program;
`lm_calls.jsonl.gz` every LM call it made (`pipeline.lm.record`), which the rerun replays, so an
LM run reproduces without the LM. The rerun refuses changed data or a changed index (an index
whose embeddings alone differ, as another CPU rounds them, goes on with a note), reruns the
recorded config as a new run tagged `hyperprove.reproduces`, and prints every metric as equal or
with its change (timings are wall-clock and not compared).

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
import time
from pathlib import Path

from experiments.runs.evaluate import run_evaluation
from experiments.runs.tracking import evaluation_tracker
from modules.errors import HyperProveError
from modules.facts import Passage
from pipeline.config import HyperProveConfig, TrackingConfig
from pipeline.index.commands import corpus_digest, corpus_passages
from pipeline.index.documents import Reading
from pipeline.provenance import git_state
from pipeline.sharing import why_refused
from pipeline.traces import connect

TIMING = ("seconds_per_question", "retrieval_ms_per_question")  # wall-clock: reported, never compared
# what the LM work cost: a rerun answered from the cache spends no tokens, so reported, never compared
COST = ("prompt_tokens_per_question", "cached_prompt_tokens_per_question", "completion_tokens_per_question", "lm_cache_hits")


def recorded_evaluation(tracking: TrackingConfig, run_id: str, scratch: Path) -> dict:
    """The results.json, index_manifest.json and compiled program (bytes) an evaluate run logged,
    and its recorded LM calls downloaded into `scratch` (None where the run logged none)."""
    from pipeline.lm.record import RECORD_FILE

    connect(tracking)
    scratch.mkdir(parents=True, exist_ok=True)
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking.uri)
    try:
        run = client.get_run(run_id)
    except MlflowException:
        raise HyperProveError(f"run {run_id}: not in the tracking store {tracking.uri}") from None
    if run.data.tags.get("hyperprove.kind") != "evaluate":
        raise HyperProveError(f"run {run_id}: not a `hyperprove evaluate` run")
    names = {artifact.path for artifact in client.list_artifacts(run_id)}
    if "results.json" not in names:
        raise HyperProveError(f"run {run_id}: its results.json artifact is missing")
    for name in ("results.json", "index_manifest.json", "program.json", RECORD_FILE):
        if name in names:
            client.download_artifacts(run_id, name, str(scratch))
    recorded = read_recorded(scratch, f"run {run_id}")
    recorded["tags"] = dict(run.data.tags)
    return recorded


def read_recorded(folder: Path, label: str) -> dict:
    """What a results folder holds of a run: results.json, index_manifest.json (or None), the
    compiled program's bytes (or None), and the folder itself as the record of its LM calls when
    results.json names one (`lm_calls`, else None)."""
    recorded: dict = {}
    for key, name in (("results", "results.json"), ("index_manifest", "index_manifest.json")):
        path = folder / name
        if not path.is_file():
            if key == "results":
                raise HyperProveError(f"{label}: has no results.json")
            recorded[key] = None
            continue
        try:
            recorded[key] = json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError, RecursionError):
            raise HyperProveError(f"{label}: its {name} is not valid JSON") from None
    program = folder / "program.json"
    recorded["program"] = program.read_bytes() if program.is_file() else None
    results = recorded["results"]
    if not isinstance(results, dict):
        raise HyperProveError(f"{label}: its results.json is not a JSON object")
    for key, kind in (("config", dict), ("systems", dict), ("data_sha256", dict)):
        if not isinstance(results.get(key), kind):
            raise HyperProveError(f"{label}: its results.json has no {key!r} object (not written by `hyperprove evaluate`)")
    if results.get("lm_calls") is not None and not isinstance(results["lm_calls"], dict):
        raise HyperProveError(f"{label}: its results.json's 'lm_calls' is not an object")
    recorded["lm_calls"] = folder if results.get("lm_calls") else None
    return recorded


def vector_files() -> set[str]:
    """The files of a saved index that hold embeddings: the vectors and their FAISS indexes."""
    from pipeline.index.build import VECTOR_SETS
    from pipeline.index.store import added_file

    return {*(f"{name}_vectors.npy" for name in VECTOR_SETS), *VECTOR_SETS.values(), *map(added_file, VECTOR_SETS.values())}


def index_difference(recorded: dict | None, current: dict | None) -> str | None:
    """How the index a rerun loads differs from the one the run recorded: None (the same),
    "vectors" (every file but the embeddings and their FAISS indexes is the same: the embedder
    rounds differently on another CPU, so the text, entities, synonyms and graph agree and only
    the last bits of the vectors may not), else "index"."""
    if same_index(recorded, current):
        return None
    if recorded is not None and current is not None and "files" in recorded and "files" in current:
        numeric = vector_files()
        files, now = recorded["files"], current["files"]
        if files.keys() == now.keys() and all(files[name] == now[name] for name in files if name not in numeric):
            return "vectors"
    return "index"


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


def rerun_config(recorded: dict, label: str, tracking: TrackingConfig, out: str, cache_dir: str | None,
                 trust_record: bool = False, live: bool = False) -> HyperProveConfig:
    """The recorded config with the local side's output folder, cache, tracking store and model
    folder, replaying the run's recorded LM calls where it has them. A recorded LM endpoint that the
    rerun would call (no record, or `live`) is refused unless `trust_record`; a strict replay calls no LM."""
    results = recorded["results"]
    # in one process here, whatever cluster the run was answered on: its metrics are the same
    values = {key: value for key, value in results["config"].items() if key != "cluster"}
    config = HyperProveConfig.from_record(values, source=label)
    local = HyperProveConfig()
    replay = recorded["lm_calls"]
    if not trust_record:
        named = endpoint(config)
        if named and (replay is None or live):
            raise HyperProveError(f"{label} names {named}; reproducing it would send every question (and your API key) "
                                  "there: check the record, then pass --trust-record")
        if reason := why_refused("index.embedder", config.index.embedder):
            raise HyperProveError(f"{label}: its embedder {config.index.embedder!r} {reason}; reproducing it would load that "
                                  "folder as a model: check the record, then pass --trust-record")
        values = config.to_dict()  # (`with_overrides` keeps a field it is given None for)
        values["lm"].update(local_model_dir=local.lm.local_model_dir, **({"api_base": None} if named else {}))
        config = HyperProveConfig.from_dict({**values, "cache_dir": local.cache_dir}, source=label)
    if config.program.compiled and not results.get("program_sha256"):
        raise HyperProveError(f"{label}: its config names a compiled program but the record has no program_sha256")
    return config.with_overrides(
        evaluation={"out": out, "name": f"{safe_name(results.get('name'))}-reproduce"},
        tracking={"uri": tracking.uri, "artifacts": tracking.artifacts, "experiment": tracking.experiment,
                  "enabled": tracking.enabled, "traces": tracking.traces},
        lm={"replay": str(replay) if replay is not None else None, "live": live},
        cache_dir=cache_dir,
    )


def check_data(results: dict, config: HyperProveConfig, label: str, refusing: str = "not reproducing") -> list[Passage] | None:
    """The questions and the corpus (a file, or a folder of documents) are here and are the ones
    the run was evaluated on; returns the passages of a folder corpus, which checking it reads
    (None for a file)."""

    run, passages = config.evaluation, None
    for kind in ("questions", "corpus"):
        path = getattr(run, kind)
        folder = kind == "corpus" and bool(path) and Path(path).is_dir()
        if not path or not (folder or Path(path).is_file()):
            raise HyperProveError(f"{path}: the {kind} file of {label} is not here (run from the folder it was evaluated in)")
        if folder:
            passages, _ = corpus_passages(path, Reading.of(config.index), log=lambda line: None)
        if corpus_digest(path, passages) != results["data_sha256"].get(kind):  # a file's sha256, a folder's passages'
            raise HyperProveError(f"{path}: differs from the {kind} {label} was evaluated on (sha256 mismatch); {refusing}")
    return passages


def reproduce(source: str, tracking: TrackingConfig, out: str | None = None, cache_dir: str | None = None,
              trust_record: bool = False, make_runtime=None, log=print, live: bool = False) -> dict:
    """Rerun an evaluate run, from a results folder or by its id in the tracking store, replaying
    its recorded LM calls (a call not in the record stops the rerun unless `live`); returns the new
    run, its folder and the deltas. `make_runtime(config)` gives the LM and embedder of the rerun
    (default: the configured ones)."""
    from experiments.harness import timestamp

    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        if Path(source).is_dir():
            label = str(source)
            recorded = read_recorded(Path(source), label)
        else:
            label = f"run {source}"
            recorded = recorded_evaluation(tracking, source, Path(scratch) / "record")
        results = recorded["results"]
        out = out or str(Path(".hyperprove") / "results" / f"{safe_name(results.get('name'))}-reproduce-{timestamp()}")
        config = rerun_config(recorded, label, tracking, out, cache_dir, trust_record, live)
        check_data(results, config, label)
        if results.get("git_commit"):
            now = git_state().get("git_commit")
            if now != results["git_commit"]:
                log(f"note: {label} was made at commit {str(results['git_commit'])[:10]}, this is {str(now)[:10]}")
        if recorded["lm_calls"] is not None:
            log(f"replaying its {results['lm_calls'].get('calls')} recorded LM calls" + ("; new ones go to the LM" if live else ""))
        elif results.get("decomposition") == "lm":
            log(f"note: {label} recorded no LM calls (made before runs recorded them): the LM is asked again, from the cache where it holds the calls")
        shown = config.to_dict()
        log(f"reproducing {label} with this config:")
        for section in ("evaluation", "retriever", "index", "lm", "program"):
            log(f"  {section}: {json.dumps(shown[section])}")
        log(f"  cache_dir: {json.dumps(shown['cache_dir'])}")

        def check_index(manifest: dict | None) -> None:
            difference = index_difference(recorded["index_manifest"], manifest)
            if difference == "index":
                raise HyperProveError(f"the index differs from the one {label} used (index manifest checksums); not reproducing")
            if difference == "vectors":
                log("note: the index's vectors differ from the recorded checksums (the embedder rounds differently on this CPU); "
                    "its passages, facts, entities and synonyms do not. A retrieval that changed would ask for an LM call "
                    "the record lacks, or move a metric, so the verdict below still holds")

        if results.get("program_sha256"):  # rerun with the compiled program the run logged
            program = recorded["program"]
            if program is None or hashlib.sha256(program).hexdigest() != results["program_sha256"]:
                raise HyperProveError(f"{label}: its compiled program.json is missing or differs from the recorded sha256")
            (Path(scratch) / "program.json").write_bytes(program)
            config = config.with_overrides(program={"compiled": str(Path(scratch) / "program.json")})
        runtime = make_runtime(config) if make_runtime else None
        outcome = run_evaluation(config, runtime, tags={"hyperprove.reproduces": str(source)}, check_index=check_index, log=log,
                                 track=evaluation_tracker(config, log) if config.tracking.enabled else None)
    replay = None
    if recorded["lm_calls"] is not None:  # did the rerun ask exactly what the run asked?
        now = outcome.get("lm_calls") or {"calls": 0, "replayed": None}
        replay = {"recorded": results["lm_calls"].get("calls"), "asked_again": (now["replayed"] or {}).get("calls", 0)}
        replay["new"] = now["calls"] - replay["asked_again"]
        log(f"LM calls: {replay['asked_again']} of the {replay['recorded']} recorded asked again, {replay['new']} new")
    deltas = metric_deltas(results["systems"], outcome["retrievers"])
    for system, values in deltas.items():
        log(f"{system}: " + ", ".join(f"{key} {results['systems'][system][key]:.4g} " + ("=" if delta == 0 else f"{delta:+.4g}")
                                      for key, delta in values.items()))
    identical = all(delta == 0 for values in deltas.values() for delta in values.values())
    seconds = round(time.perf_counter() - started, 1)
    log(f"reproduced {label} in {seconds} s: " + ("every metric identical" if identical else "metrics differ (above)")
        + " (wall-clock times and token costs are not compared)")
    return {"run": str(source), "reproduction": outcome["mlflow_run"], "out": outcome["out"], "identical": identical,
            "deltas": deltas, "seconds": seconds, "lm_calls": replay}
