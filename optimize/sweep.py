"""`hyperprove sweep` as one function: an Optuna study of the retriever's parameters on a question
set, its MLflow runs, and its summary.

- One MLflow parent run per invocation, one nested run per trial, and the history, importance and
  parallel-coordinate plots as artifacts of the parent.
- Afterwards the best and the configured parameters are compared question by question, on the
  sweep's own questions, on the held-out `validate` set, and on `transfer_questions` over another
  corpus (paired bootstrap, `experiments.stats`).
- The summary folder (sweep.json and the plots, and the best config when it is written there) is
  replaced as a whole, so a kill leaves the previous summary or the new one.

The study mechanics (storage, seeds, workers, resuming) are in `optimize/study.py`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Sequence

from experiments.data import load_questions
from experiments.runs.tracking import active_run_id, metric_name, tracked_run, worker_tags
from experiments.stats import describe_difference, paired_difference
from modules.errors import HyperProveError
from pipeline.config import HyperProveConfig, SweepConfig
from pipeline.files import atomic_directory, atomic_write_json, check_own_file, check_replaceable, sha256_file
from pipeline.index.commands import corpus_digest, corpus_passages
from pipeline.index.documents import Reading
from pipeline.provenance import git_state
from pipeline.runtime import Runtime

SUMMARY_FILES = ("sweep.json", "history.png", "importances.png", "parallel_coordinates.png")


def is_best_config(data) -> bool:
    """An earlier sweep's best config, which a sweep may replace: a config's retriever and index sections."""
    return isinstance(data, dict) and set(data) == {"retriever", "index"} and all(isinstance(v, dict) for v in data.values())


def compare(sweep: SweepConfig, score_chunk: Callable[[dict, Sequence], list[dict]], start: dict, best: dict, questions: Sequence) -> dict:
    """The configured and the best parameters on one question set: each one's objective and
    tie-break (percent, as a trial computes them) and their paired difference on the objective."""
    from optimize.study import trial_scores

    rows = {kind: score_chunk(params, questions) for kind, params in (("start", start), ("best", best))}
    scored = {f"{kind}_scores": {key: round(value, 2) for key, value in trial_scores(sweep, kind_rows).items() if key != "value"}
              for kind, kind_rows in rows.items()}
    return {"n_questions": len(rows["start"]), **scored,
            "difference": paired_difference(rows["best"], rows["start"], sweep.objective, seed=sweep.seed)}


def study_setting(config: HyperProveConfig, corpus_sha256: str) -> dict:
    """What a study optimises besides its parameters: a rerun with anything else here is refused."""

    run, sweep = config.evaluation, config.sweep
    setting = {
        "objective": sweep.objective, "tie_break": sweep.tie_break, "ranges": sweep.ranges, "chunk": sweep.chunk, "seed": sweep.seed,
        "questions_sha256": sha256_file(run.questions), "corpus_sha256": corpus_sha256, "limit": run.limit,
        "decomposition": run.decomposition, "index": config.index.shaping(), **({"skip": run.skip} if run.skip else {}),
        "retriever": {name: value for name, value in config.retriever.to_dict().items() if name not in sweep.ranges},
    }
    if run.decomposition == "lm":
        compiled = config.program.compiled
        setting.update(lm=config.lm.id, program={"max_hops": config.program.max_hops, "carry": config.program.carry,
                                                 "compiled_sha256": sha256_file(compiled) if compiled else None})
    return setting


def run_sweep(config: HyperProveConfig, runtime=None, log: Callable[[str], None] = print) -> dict:
    """Continue (or start) the configured study until it holds `sweep.trials` finished trials;
    write the best parameters as an experiment config and the summary with its comparisons."""
    from experiments.gold import evaluate_ranker, hyperprove_chain
    from experiments.harness import timestamp
    from optimize import study as studies
    from pipeline.index.store import cached_index
    from pipeline.program import program_for

    source = git_state()  # the code that runs: taken now, not when the sweep ends
    run, sweep = config.evaluation, config.sweep
    if not run.questions or not run.corpus:
        raise HyperProveError("sweep: give --questions and --corpus (or a --config with evaluation.questions and evaluation.corpus)")
    with_lm = run.decomposition == "lm"
    if sweep.objective in ("f1", "em") and not with_lm:
        raise HyperProveError(f"--objective {sweep.objective} needs answers: use --decomposition lm")
    out = Path(run.out or Path(".hyperprove") / "sweeps" / f"{sweep.study}-{timestamp()}")
    best_out = Path(sweep.best_out or Path(".hyperprove") / "sweeps" / f"{sweep.study}-best.json")
    best_inside = best_out.resolve().parent == out.resolve()  # then it is part of the summary folder
    check_own_file(best_out, is_best_config, "a sweep's best config", "--best-out")
    check_replaceable(out, {*SUMMARY_FILES, *([best_out.name] if best_inside else [])} if (out / "sweep.json").is_file() else None,
                      "a sweep summary")
    if with_lm:
        program_for(None, config)  # a compiled program that does not load fails now
    reading = Reading.of(config.index)
    passages, _ = corpus_passages(run.corpus, reading, log)
    questions = run.selected(load_questions(run.questions, passages))
    held_out = load_questions(sweep.validate, passages) if sweep.validate else None
    if sweep.transfer_questions:
        transfer_passages, _ = corpus_passages(sweep.transfer_corpus, reading, log)
        transfer = load_questions(sweep.transfer_questions, transfer_passages)
    setting = study_setting(config, corpus_digest(run.corpus, passages))
    studies.open_study(sweep, setting)  # an unusable storage or a study made for another setting fails now
    runtime = runtime or Runtime(config)
    session = runtime.session if with_lm else None
    index, _ = cached_index(passages, config, runtime, log)
    embedder = runtime.embedder
    embedder.load()

    def scorer(index) -> Callable[[dict, Sequence], list[dict]]:
        """Per-question rows of the retriever with given parameters over `index`."""
        def score_chunk(params: dict, chunk) -> list[dict]:
            retriever = index.retriever(config.with_overrides(retriever=params).retriever, embedder.encode_query)
            if with_lm:
                from experiments.qa import evaluate_program

                return evaluate_program(chunk, program_for(retriever, config), session.calls)[1]
            return evaluate_ranker(chunk, lambda question: hyperprove_chain(question, retriever))[1]
        return score_chunk

    score_chunk = scorer(index)

    def on_trial(trial, params: dict, scores: dict | None) -> None:
        if mlflow is not None:
            with mlflow.start_run(experiment_id=mlflow.active_run().info.experiment_id, run_name=f"trial-{trial.number}", nested=True):
                mlflow.set_tags(worker_tags())
                mlflow.log_params(params)
                mlflow.set_tag("optuna.state", "complete" if scores is not None else "pruned")
                if scores is not None:
                    mlflow.log_metrics({metric_name("hyperprove", key): value for key, value in scores.items()})

    def shown(scores: dict | None) -> str:
        return ", ".join(f"{key} {value:.2f}" for key, value in (scores or {}).items()) or "not scored"

    tags = {"hyperprove.kind": "sweep", "optuna.study": sweep.study, "optuna.storage": sweep.storage, **source}
    start = studies.starting_point(sweep, config.to_dict()["retriever"])
    with tracked_run(config.tracking, config.to_dict(), f"sweep-{sweep.study}", tags) as mlflow:
        study = studies.run_trials(sweep, questions, score_chunk, on_trial, start=start, setting=setting)
        result = {**studies.summary(study), "objective": sweep.objective, "tie_break": sweep.tie_break, "questions": run.questions,
                  "n_questions": len(questions), "start_params": start, "start_scores": studies.trial_scores_of(study, start)}
        best_params = studies.best_parameters(study)
        best_config = {"retriever": {**config.to_dict()["retriever"], **best_params}, "index": config.to_dict()["index"]}
        result["best_config"] = str(best_out)
        log(f"study {sweep.study!r} in {sweep.storage}: {result['complete']} complete, {result['pruned']} pruned; best trial "
            f"{result['best_trial']}: {shown(result['best_scores'])} with {best_params} -> {best_out}; "
            f"the configured parameters: {shown(result['start_scores'])}")
        # Is the best trial's margin more than the luck of picking the best of many on few questions?
        result["difference"] = compare(sweep, score_chunk, start, best_params, questions)["difference"]
        log(f"best minus configured, question by question: {describe_difference(result['difference'])}")
        if held_out is not None:  # the held-out check: do the best parameters beat the configured ones there?
            result["validation"] = {"questions": sweep.validate, **compare(sweep, score_chunk, start, best_params, held_out)}
            log(f"on {sweep.validate} ({len(held_out)} questions): best parameters {shown(result['validation']['best_scores'])}; "
                f"configured ones {shown(result['validation']['start_scores'])}; "
                f"best minus configured: {describe_difference(result['validation']['difference'])}")
        if sweep.transfer_questions:  # and on another corpus: does the setting carry over?
            transfer_index, _ = cached_index(transfer_passages, config, runtime, log)
            result["transfer"] = {"questions": sweep.transfer_questions, "corpus": sweep.transfer_corpus,
                                  **compare(sweep, scorer(transfer_index), start, best_params, transfer)}
            log(f"on {sweep.transfer_questions} ({len(transfer)} questions, another corpus): best parameters "
                f"{shown(result['transfer']['best_scores'])}; configured ones {shown(result['transfer']['start_scores'])}; "
                f"best minus configured: {describe_difference(result['transfer']['difference'])}")
        if mlflow is not None:
            result["mlflow_run"] = active_run_id(mlflow)
        with atomic_directory(out) as scratch:
            plots = studies.save_plots(study, scratch)
            best_path = scratch / best_out.name if best_inside else best_out
            atomic_write_json(best_path, best_config)
            atomic_write_json(scratch / "sweep.json", {**result, "finished": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                                       **source, "config": config.to_dict()})
            if mlflow is not None:
                for path in [*plots, best_path, scratch / "sweep.json"]:
                    mlflow.log_artifact(str(path))
                scored = {"best": result["best_scores"], "start": result["start_scores"]}
                for check in ("validation", "transfer"):
                    if check in result:
                        scored.update({f"{check}_{kind}": result[check][f"{kind}_scores"] for kind in ("best", "start")})
                for prefix, scores in scored.items():
                    mlflow.log_metrics({metric_name(prefix, key): value for key, value in (scores or {}).items()})
    log(f"summary and plots in {out}/")
    result["out"] = str(out)
    return result
