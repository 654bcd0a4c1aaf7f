"""`hyperprove evaluate` as one function: systems on a question set and the results folder
(`track`, e.g. `experiments.runs.tracking.evaluation_tracker`, adds the MLflow run).

Everything that can be wrong with the request (missing files, a results folder that is not one,
a compiled program that does not load) is found before the first question, so a long evaluation
never fails at its end. The results folder is written as a whole: a reader (or a kill) sees the
previous results or the new ones, never a mix, and a reused folder keeps no file of an earlier run.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Callable

from experiments.data import load_questions, unfound_quotes
from experiments.runs.failures import write_pages
from modules.errors import HyperProveError
from pipeline.config import HyperProveConfig
from pipeline.files import (
    atomic_directory,
    atomic_write_bytes,
    atomic_write_json,
    check_replaceable,
    read_json,
    sha256_file,
)
from pipeline.index.commands import corpus_digest, corpus_passages
from pipeline.index.documents import Reading
from pipeline.provenance import git_state
from pipeline.runtime import Runtime

RESULT_FILES = ("results.md", "results.json", "predictions.json", "index_manifest.json", "program.json", "pages", "lm_calls.jsonl.gz")
Track = Callable[[dict, dict, dict], "str | None"]  # (result files, summaries, tags) -> the id of the run that logged them


def results_folder(config: HyperProveConfig) -> Path:
    """`evaluation.out`, or .hyperprove/results/<questions' folder>-<file>-<decomposition>-<time>."""
    from experiments.harness import timestamp

    run = config.evaluation
    return Path(run.out or Path(".hyperprove") / "results" / f"{run_name(config)}-{timestamp()}")


def run_name(config: HyperProveConfig) -> str:
    run = config.evaluation
    dataset = Path(run.questions).resolve()
    return run.name or f"{dataset.parent.name}-{dataset.stem}-{run.decomposition}"


def check_results_folder(out: Path) -> None:
    """A results folder may replace an earlier one (it holds results.json and our files only)."""

    earlier = out.is_dir() and (out / "results.json").is_file()
    check_replaceable(out, RESULT_FILES if earlier else None, "evaluation results")


def run_evaluation(config: HyperProveConfig, runtime=None, tags: dict | None = None,
                   check_index: Callable[[dict | None], None] | None = None, log: Callable[[str], None] = print,
                   track: Track | None = None, make_runtime: Callable | None = None) -> dict:
    """Evaluate the configured systems; `check_index` sees the index manifest before any question,
    `track` the finished result files before they are moved into place (`experiments.runs.tracking`
    logs them to MLflow). With `cluster.ray`, the LM systems' questions are answered by Ray
    workers, each with `make_runtime(config)` (default `Runtime`) at its LM endpoint, and no LM is
    started here. Returns {"retrievers": {system: summary}, "out": folder, "mlflow_run": id or None}."""
    from experiments.harness import PASSAGE_LEVEL, evaluate_systems, make_setup, parse_systems, write_results
    from pipeline.index.store import cached_index, load_index, read_manifest
    from pipeline.lm.record import CallRecord, read_record, read_records
    from pipeline.program import program_for

    run = config.evaluation
    if not run.questions or not run.corpus:
        raise HyperProveError("evaluate: give --questions and --corpus (or a --config with evaluation.questions and evaluation.corpus)")
    source = git_state()  # the code that runs: taken now, not when a long run ends
    names = parse_systems(run.retrievers)
    with_lm = run.decomposition == "lm"
    if with_lm and config.cluster.ray is not None:
        from pipeline.lm.cluster import ray_module

        ray_module()  # the extra is missing: say so before any work
    out = results_folder(config)
    check_results_folder(out)
    passages, _ = corpus_passages(run.corpus, Reading.of(config.index), log)
    questions = run.selected(load_questions(run.questions, passages))
    if lost := unfound_quotes(questions):
        log(f"{run.questions}: {len(lost)} of {sum(len(q.evidence) for q in questions)} evidence quotes are in no passage of "
            f"{run.corpus}; recall leaves them out: " + "; ".join(lost))
    if with_lm:
        program_for(None, config)  # a compiled program that does not load fails now, not after the run
    runtime = runtime or Runtime(config)
    embedder = runtime.embedder
    on_ray = with_lm and config.cluster.ray is not None
    session = runtime.session if with_lm and not on_ray else None  # an index still to extract with the LM starts it itself
    index_directory: Path | None = None  # where the index used lives, for its manifest

    def load():
        nonlocal index_directory
        if run.index:
            index_directory = Path(run.index)
            return load_index(run.index, expect=config.index)
        index, index_directory = cached_index(passages, config, runtime, log, make_runtime)
        return index

    setup = make_setup(config, passages, embedder, load, needs_index=bool(run.index) or any(name not in PASSAGE_LEVEL for name in names),
                           index_label=f"{run.index} (for {run.corpus})" if run.index else "the cached index")
    index_manifest = None
    if setup.needs_index:  # build or load it now, outside the per-question timing
        index = setup.index
        index_manifest = read_manifest(index_directory) if index_directory else {"saved": False, **index.info, "counts": index.counts()}
    if check_index is not None:
        check_index(index_manifest)
    embedder.load()
    embedder.encode_query("warm-up")  # the first call pays one-off set-up costs, not a system
    if on_ray:  # the workers' calls come back to this record
        lm_id, record = runtime.lm_id, CallRecord(replaying=read_records(config.lm.replay) if config.lm.replay else None)
    else:
        lm_id, record = (session.id, session.record) if session else (None, None)
    header = results_header(config, len(questions), lm_id, source, corpus_digest(run.corpus, passages))
    partial = partial_folder(out)
    check_results_folder(partial)
    finished, earlier = load_finished(partial, header, names)
    if finished:
        log(f"resuming: {', '.join(finished)} finished earlier, kept in {partial}/")
        header["resumed"] = {"systems": list(finished), **{key: earlier[key] for key in ("git_commit", "git_dirty") if key in earlier}}
        if record is not None and earlier.get("lm_calls"):  # their LM calls belong to this run's record too
            record.add(read_record(partial).calls.values())

    def keep(results: dict) -> None:
        with atomic_directory(partial) as scratch:
            write_results(scratch, {**header, "complete": False}, results, record)

    answer = None
    if on_ray:
        from experiments.runs.distributed import RayAnswerer

        if setup.needs_index and index_directory is None:
            raise HyperProveError("--ray: the workers load the index from its folder, and this one was not saved (extraction "
                                  "fell back on some passages); build it with `hyperprove index CORPUS --out DIR` and pass --index DIR")
        answer = RayAnswerer(config, index_directory if setup.needs_index else None, make_runtime or Runtime, record, log)
        log(f"answering on Ray ({config.cluster.ray}): {answer.describe()}")
    try:
        results = evaluate_systems(names, questions, setup, run.decomposition, run.read, finished=finished, on_result=keep,
                                   trace=runtime.question_trace if track is not None else None, answer=answer)
    finally:
        if answer is not None:
            answer.close()
    lm_tags = {"hyperprove.lm": lm_id} if with_lm else {}
    outcome = record_evaluation(config, results, out, header, index_manifest, {**source, **lm_tags, **(tags or {})}, log, track,
                                pages=(questions, [passage.title for passage in passages]), record=record)
    shutil.rmtree(partial, ignore_errors=True)
    if runtime.traces_started:
        outcome["traces"] = runtime.traces.close(outcome["mlflow_run"])
        log(f"{outcome['traces']} question traces in the run's experiment")
    return outcome


def partial_folder(out: Path) -> Path:
    """Where a run keeps the systems it has finished until it completes: beside `out`, in the same
    format, so an interrupted run (even one moved to another machine) resumes system by system."""
    return out.with_name(f"{out.name}.partial")


def resumable(header: dict) -> dict:
    """What an interrupted run and its resumption must share: everything but the time, the code
    version, the list of systems, the description, where it ran and where MLflow logs. A setting
    added to the code since the interrupted run counts with the value that run went without it
    (`HyperProveConfig.from_record`)."""
    config = HyperProveConfig.from_record(header["config"]).to_dict()
    config["evaluation"].pop("retrievers", None)
    config["evaluation"].pop("description", None)
    config.pop("cluster", None)  # a run interrupted here may resume on Ray, and back
    config.pop("tracking", None)
    kept = {key: value for key, value in header.items()
            if key not in ("finished", "git_commit", "git_dirty", "systems", "complete", "resumed", "lm_calls", "description")}
    return {**kept, "config": config}


def load_finished(partial: Path, header: dict, names: list[str]) -> tuple[dict, dict]:
    """The finished systems of an interrupted run of this same evaluation, and that run's header
    (both empty when there is none)."""
    from experiments.harness import SystemResult

    if not (partial / "results.json").is_file():
        return {}, {}
    earlier = read_json(partial / "results.json", "interrupted results")
    if not isinstance(earlier, dict) or "config" not in earlier or resumable(earlier) != resumable(header):
        raise HyperProveError(f"{partial}: holds an interrupted run of another evaluation (config, data or LM differ); "
                              "remove it to start afresh, or choose another --out")
    predictions = read_json(partial / "predictions.json", "interrupted predictions")
    finished = {name: SystemResult(name, summary, predictions[name]) for name, summary in earlier["systems"].items() if name in names}
    return finished, earlier


def results_header(config: HyperProveConfig, n_questions: int, lm_id: str | None, tags: dict, corpus_sha256: str) -> dict:
    """What a results folder says about its run: data (with checksums), settings, LM, code version."""

    run = config.evaluation
    compiled = config.program.compiled
    return {
        "name": run_name(config), "description": run.description, "questions": run.questions, "corpus": run.corpus,
        "data_sha256": {"questions": sha256_file(run.questions), "corpus": corpus_sha256},
        "n_questions": n_questions, "decomposition": run.decomposition, "read": run.read, "lm": lm_id,
        "program_sha256": sha256_file(compiled) if compiled else None,
        **{key: tags[key] for key in ("git_commit", "git_dirty") if key in tags}, "config": config.to_dict(),
    }


def record_evaluation(config: HyperProveConfig, results: dict, out: Path, header: dict, index_manifest: dict | None,
                      tags: dict, log: Callable[[str], None] = print, track: Track | None = None,
                      pages: tuple[list, list[str]] | None = None, record=None) -> dict:
    """Write the results folder (atomically, as a whole) and print the table; `track` sees the
    files first. `header` (from `results_header`) carries the git state taken when the run started;
    with `pages` (the questions and the passage titles), systems that answered get an
    evidence-chain page per question in `pages/`; with `record` (`pipeline.lm.record.CallRecord`)
    the run's LM calls are `lm_calls.jsonl.gz`, their sha256 in results.json, and the returned
    `lm_calls` says how many there were and how many a replayed record answered."""
    from experiments.harness import results_table, write_results

    compiled = config.program.compiled
    header = {**header, "finished": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    outcome = {"retrievers": {n: r.summary for n, r in results.items()}, "out": str(out), "mlflow_run": None}
    with atomic_directory(out) as scratch:
        paths = write_results(scratch, header, results, record)
        if index_manifest is not None:
            paths["index_manifest"] = scratch / "index_manifest.json"
            atomic_write_json(paths["index_manifest"], index_manifest)
        if pages is not None and write_pages(scratch / "pages", {name: r.rows for name, r in results.items()}, *pages):
            paths["pages"] = scratch / "pages"
        if compiled:  # the compiled program travels with the results (and into the MLflow run)
            paths["program"] = scratch / "program.json"
            atomic_write_bytes(paths["program"], Path(compiled).read_bytes())
        if track is not None:
            outcome["mlflow_run"] = track(paths, outcome["retrievers"], tags)
            if outcome["mlflow_run"]:
                atomic_write_json(paths["results"], {**read_json(paths["results"], "results"), "mlflow_run": outcome["mlflow_run"]})
    log(results_table([r.summary for r in results.values()]).rstrip())
    recorded = ""
    if record is not None:
        outcome["lm_calls"] = {"calls": len(record), "replayed": record.replayed()}
        replayed = outcome["lm_calls"]["replayed"]
        recorded = f"the {len(record)} LM calls" + (f" ({replayed['calls']} replayed from {replayed['from']})" if replayed else "") + ", "
    log(f"results, predictions, {'evidence-chain pages (pages/index.html), ' if 'pages' in paths else ''}{recorded}the index manifest in {out}/")
    return outcome
