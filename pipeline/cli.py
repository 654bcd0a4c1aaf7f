"""The `hyperprove` command line: the one room that reaches every folder.

Heavy imports happen inside the commands that need them. Every command takes --json (one JSON
object as the last line of output); bad input exits 2 with a one-line `error: ...` message.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Callable

from modules.errors import HyperProveError
from pipeline.config import HyperProveConfig


REPOSITORY = Path(__file__).resolve().parents[1]
DEMO_DIR = REPOSITORY / "experiments" / "demo"
# Third-party settings the command line fixes for every command: no reaching for the network at
# import or first use, and no progress bars of MLflow's own between ours.
LIBRARY_DEFAULTS = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "TOKENIZERS_PARALLELISM": "false",
    "MLFLOW_ENABLE_ASYNC_TRACE_LOGGING": "false",
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
}


LM_ERROR_MODULES = {"litellm", "openai", "httpx", "httpcore"}  # besides DSPy's own LMError


def _add_config_flags(parser: argparse.ArgumentParser, retriever: bool = True, extractor: str = "sentences") -> None:
    parser.add_argument("--config", help="experiment config file (JSON); flags override it")
    parser.add_argument("--extractor", choices=["sentences", "lm"], help=f"fact extractor (default: {extractor})")
    parser.add_argument("--embedder", help="embedder id (default: all-MiniLM-L6-v2, from its package)")
    parser.add_argument("--eta", type=float, help="synonym cosine threshold (default 0.8)")
    parser.add_argument("--cache-dir", help="embeddings, indexes, LM extractions and LM calls (default .hyperprove/cache)")
    if retriever:
        parser.add_argument("--alpha", type=float, help="weight of cosine against struct (step 9)")
        parser.add_argument("--theta", type=float, help="transition threshold (step 8)")
        parser.add_argument("--depth", type=int, help="L, breadth-first steps (step 8)")
        parser.add_argument("--top-k", type=int, help="K, facts per hop (step 9)")
        parser.add_argument("--seeds", type=int, dest="n_seeds", help="dense seed facts per hop (step 6)")
        parser.add_argument("--subgraph-bound", type=int, help="facts in the local subgraph (step 7)")
    parser.add_argument("--lm", dest="lm_model", help="LiteLLM model id, e.g. openai/gpt-4o-mini (default: the embedded local model)")
    parser.add_argument("--lm-threads", type=int, help="concurrent LM requests (default: 1 for the local model, 8 for an API model)")
    parser.add_argument("--json", action="store_true", help="end with one JSON object")


def _add_tracking_flags(parser: argparse.ArgumentParser, logs: str | None = None) -> None:
    """--tracking-uri, and --no-track for commands that log `logs` (one run, or runs)."""
    parser.add_argument("--tracking-uri", help="MLflow tracking store (default sqlite:///.hyperprove/mlflow.db)")
    if logs:
        parser.add_argument("--no-track", action="store_const", const=False, dest="track", help=f"do not log {logs}")


def _add_program_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--program", help="compiled program JSON (from `hyperprove compile`)")
    parser.add_argument("--max-hops", type=int, help="most sub-questions per question (default 4)")


COMPILE_FLAGS = ("questions", "corpus", "target", "optimizer", "train", "val", "max_bootstrapped_demos", "max_labeled_demos",
                 "threshold", "auto", "budget", "prompt_lm", "seed", "out")


def _config(args: argparse.Namespace) -> HyperProveConfig:
    path = getattr(args, "config", None)
    base = HyperProveConfig.from_file(path) if path else HyperProveConfig()
    flag = lambda name: getattr(args, name, None)  # noqa: E731
    return base.with_overrides(
        retriever={k: flag(k) for k in ("alpha", "theta", "depth", "top_k", "n_seeds", "subgraph_bound")},
        index={"extractor": flag("extractor"), "embedder": flag("embedder"), "eta": flag("eta")},
        lm={"model": flag("lm_model"), "threads": flag("lm_threads")},
        program={"max_hops": flag("max_hops"), "compiled": flag("program")},
        evaluation={k: flag(k) for k in ("questions", "corpus", "index", "retrievers", "decomposition", "read", "limit", "out")}
        if args.command in ("evaluate", "sweep") else {},
        sweep={k: flag(k) for k in ("trials", "objective", "storage", "study", "seed", "best_out", "validate")} if args.command == "sweep" else {},
        compile={k: flag(k) for k in COMPILE_FLAGS} if args.command == "compile" else {},
        tracking={"uri": flag("tracking_uri"), "enabled": flag("track")},
        cache_dir=flag("cache_dir"),
    )


class LMSession:
    """The configured LM, DSPy's disk cache under the cache dir, and a call counter."""

    def __init__(self, config: HyperProveConfig):
        import dspy

        from pipeline.lm import CallCounter, configure_lm_cache, make_lm

        configure_lm_cache(config.cache_dir)
        self.id = config.lm.id
        self.counter = CallCounter()
        self.lm = make_lm(config.lm, self.counter)
        dspy.configure(lm=self.lm)

    def calls(self) -> int:
        return self.counter.calls


def _extractor(config: HyperProveConfig, session: LMSession | None):
    """The configured extractor; the `lm` one starts an LM session only now, when it is needed."""
    from pipeline.extract import make_extractor

    if config.index.extractor != "lm":
        return make_extractor(config.index.extractor)
    session = session or LMSession(config)
    return make_extractor("lm", session.lm, session.id, config.cache_dir, config.lm.concurrency)


def _report_extraction(extractor) -> None:
    report = extractor.report()
    if report["name"] == "lm":
        print(
            f"lm extraction: {report['passages']} passages, {report['cached']} from the cache, "
            f"{report['extracted']} extracted, {report['retried']} retried, {report['fallbacks']} fell back to sentences"
            + (f" ({', '.join(extractor.fallback_titles[:5])}{', ...' if report['fallbacks'] > 5 else ''})" if report["fallbacks"] else "")
        )
        asked = report["passages"] - report["cached"]
        if asked:
            print(f"lm extraction took {report['lm_seconds'] / 60:.1f} min: {60 * asked / report['lm_seconds']:.1f} passages per minute")


def _embedder(config: HyperProveConfig):
    from pipeline.embedder import Embedder

    return Embedder(config.index.embedder, batch_size=config.index.batch_size, cache_dir=config.cache_dir)


def cmd_index(args: argparse.Namespace) -> dict:
    from experiments.data import load_corpus
    from pipeline.index import build_index, save_index

    config = _config(args)
    passages = load_corpus(args.corpus)
    extractor = _extractor(config, None)
    started = time.perf_counter()
    index = build_index(passages, config.index, _embedder(config), progress=True, extractor=extractor)
    save_index(index, args.out)
    seconds = time.perf_counter() - started
    _report_extraction(extractor)
    result = {"index": str(args.out), **index.counts(), "extractor": extractor.report(), "seconds": round(seconds, 2)}
    print(f"index written to {args.out}: {index.counts()} in {seconds:.1f} s")
    return result


def cached_index(passages, config: HyperProveConfig, embedder, session: LMSession | None = None):
    """The index of this corpus under this config, built once and kept in the cache dir; returns
    the index and its directory (None when fallbacks kept it out of the cache)."""
    from pipeline.index import build_index, corpus_checksum, load_index, save_index

    extractor_id = config.index.extractor + (f"-{config.lm.id}" if config.index.extractor == "lm" else "")
    key = f"{corpus_checksum(passages)[:16]}-{extractor_id}-{config.index.embedder}-eta{config.index.eta}"
    directory = Path(config.cache_dir) / "indexes" / key.replace("/", "_")
    if (directory / "manifest.json").exists():
        return load_index(directory, expect_embedder=config.index.embedder), directory
    extractor = _extractor(config, session)
    index = build_index(passages, config.index, embedder, progress=True, extractor=extractor)
    _report_extraction(extractor)
    if extractor.report().get("fallbacks", 0):  # an index with fallbacks is rebuilt next time
        return index, None
    save_index(index, directory)
    return index, directory


def _program(retriever, config: HyperProveConfig):
    """The HyperProve program around a retriever, with the compiled state of `program.compiled`."""
    from pipeline.program import HyperProve

    return _load_program(HyperProve(retriever, config.program), config.program.compiled)


def _load_program(program, path: str | None):
    """Load a compiled program's state into `program` (a HyperProve, or a reader sharing its final
    predictor); nothing to do without a path."""
    if not path:
        return program
    if not Path(path).is_file():
        raise HyperProveError(f"--program {path}: no such file")
    try:
        program.load(path)
    except (ValueError, KeyError) as error:
        raise HyperProveError(f"--program {path}: not a compiled HyperProve program ({error})") from None
    return program


def format_chain(prediction) -> list[str]:
    """The evidence chain as lines: per hop the sub-question, the query, the facts, the answer."""
    lines = []
    for hop in prediction.chain:
        lines.append(f"  hop {hop['hop']}: {hop['sub_question']}")
        if hop["query"] != hop["sub_question"]:
            lines.append(f"    rewritten: {hop['query']}")
        for fact in hop["facts"]:
            mark = "*" if fact["id"] in hop["supporting"] else " "
            lines.append(f"   {mark}[{fact['score']:.3f}] ({fact['title']}) {fact['text']}")
        lines.append(f"    -> {hop['answer']}")
    for note in prediction.fallbacks:
        lines.append(f"  fallback: {note}")
    return lines


def _answer_record(question: str, prediction) -> dict:
    return {"question": question, "answer": prediction.answer, "chain": prediction.chain, "fallbacks": prediction.fallbacks}


def cmd_ask(args: argparse.Namespace) -> dict:
    from pipeline.index import load_index

    if not args.question.strip():
        raise HyperProveError("the question is empty")
    config = _config(args)
    index = load_index(args.index, expect_embedder=config.index.embedder)
    embedder = _embedder(config)
    session = LMSession(config)
    program = _program(index.retriever(config.retriever, embedder.encode_query), config)
    started = time.perf_counter()
    prediction = program(args.question)
    print(f"Q: {args.question}")
    print("\n".join(format_chain(prediction)))
    print(f"A: {prediction.answer}")
    record = _answer_record(args.question, prediction)
    return {**record, "lm": session.id, "lm_calls": session.calls(), "seconds": round(time.perf_counter() - started, 2)}


def cmd_demo(args: argparse.Namespace) -> dict:
    from experiments.data import load_corpus, load_questions
    from experiments.metrics import exact_match

    args.extractor = args.extractor or "lm"  # the demo shows the LM extractor unless told otherwise
    config = _config(args)
    started = time.perf_counter()
    passages = load_corpus(DEMO_DIR / "corpus.json")
    questions = load_questions(DEMO_DIR / "questions.json", passages)
    print(f"demo: {len(passages)} passages ({DEMO_DIR / 'ATTRIBUTION.md'}), {len(questions)} questions, LM {config.lm.id}")
    session = LMSession(config)
    embedder = _embedder(config)
    index, _ = cached_index(passages, config, embedder, session)
    print(f"index: {index.counts()} ({time.perf_counter() - started:.0f} s)")
    program = _program(index.retriever(config.retriever, embedder.encode_query), config)
    answers = []
    for number, question in enumerate(questions, start=1):
        asked = time.perf_counter()
        prediction = program(question.question)
        correct = bool(exact_match(prediction.answer, [question.answer, *question.answer_aliases]))
        print(f"\n[{number}/{len(questions)}] {question.question}")
        print("\n".join(format_chain(prediction)))
        print(f"A: {prediction.answer}   (gold: {question.answer}{'' if correct else ', not matched'}; {time.perf_counter() - asked:.0f} s)")
        answers.append({**_answer_record(question.question, prediction), "gold": question.answer, "exact_match": correct})
    seconds = time.perf_counter() - started
    print(f"\ndemo done in {seconds:.0f} s, {session.calls()} LM calls; run it again and the caches make it fast")
    return {"answers": answers, "index": index.counts(), "lm": session.id, "lm_calls": session.calls(), "seconds": round(seconds, 2)}


def cmd_evaluate(args: argparse.Namespace) -> dict:
    return run_evaluation(_config(args))


def run_evaluation(config: HyperProveConfig, tags: dict | None = None,
                   check_index: Callable[[dict | None], None] | None = None) -> dict:
    """Evaluate the configured systems; `check_index` sees the index manifest before any question."""
    from experiments.data import load_corpus, load_questions
    from experiments.harness import PASSAGE_LEVEL, Workbench, evaluate_systems, parse_systems
    from optimize.tracking import git_state
    from pipeline.index import load_index, read_manifest

    run = config.evaluation
    if not run.questions or not run.corpus:
        raise HyperProveError("evaluate: give --questions and --corpus (or a --config with evaluation.questions and evaluation.corpus)")
    source = git_state(REPOSITORY)  # the code that runs: taken now, not when a long run ends
    names = parse_systems(run.retrievers)
    with_lm = run.decomposition == "lm"
    if run.read and not with_lm:
        raise HyperProveError("--read hands passages to the LM reader: use it with --decomposition lm")
    passages = load_corpus(run.corpus)
    questions = load_questions(run.questions, passages)[: run.limit]
    embedder = _embedder(config)
    session = LMSession(config) if with_lm else None  # an index still to extract with the LM makes its own
    index_directory: Path | None = None  # where the index used lives, for its manifest

    def load():
        nonlocal index_directory
        if run.index:
            index_directory = Path(run.index)
            return load_index(run.index, expect_embedder=config.index.embedder)
        index, index_directory = cached_index(passages, config, embedder, session)
        return index

    bench = Workbench(
        passages, config, embedder, load,
        make_program=(lambda index: _program(index.retriever(config.retriever, embedder.encode_query), config)) if with_lm else None,
        prepare_reader=lambda module: _load_program(module, config.program.compiled),
        needs_index=bool(run.index) or any(name not in PASSAGE_LEVEL for name in names),
        index_label=f"{run.index} (for {run.corpus})" if run.index else "the cached index",
    )
    index_manifest = None
    if bench.needs_index:  # build or load it now, outside the per-question timing
        index = bench.index
        index_manifest = read_manifest(index_directory) if index_directory else {"saved": False, **index.info, "counts": index.counts()}
    if check_index is not None:
        check_index(index_manifest)
    embedder.load()
    embedder.encode_query("warm-up")  # the first call pays one-off set-up costs, not a system
    results = evaluate_systems(names, questions, bench, run.decomposition, run.read, session.calls if session else (lambda: 0))
    return _record_evaluation(config, results, len(questions), session.id if session else None, index_manifest, {**source, **(tags or {})})


def _record_evaluation(config: HyperProveConfig, results: dict, n_questions: int, lm_id: str | None, index_manifest: dict | None,
                       tags: dict) -> dict:
    """Write the results folder, print the table, log the MLflow run; the `--json` object.
    `tags` carry the git state taken when the run started."""
    from experiments.harness import results_table, timestamp, write_results
    from pipeline.files import atomic_write_bytes, atomic_write_json, read_json, sha256_file

    run = config.evaluation
    compiled = config.program.compiled
    dataset = Path(run.questions).resolve()
    name = run.name or f"{dataset.parent.name}-{dataset.stem}-{run.decomposition}"
    out = Path(run.out or Path(".hyperprove") / "results" / f"{name}-{timestamp()}")
    header = {
        "name": name, "description": run.description, "questions": run.questions, "corpus": run.corpus,
        "data_sha256": {"questions": sha256_file(run.questions), "corpus": sha256_file(run.corpus)},
        "n_questions": n_questions, "decomposition": run.decomposition, "read": run.read, "lm": lm_id,
        "program_sha256": sha256_file(compiled) if compiled else None,
        "finished": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        **{key: tags[key] for key in ("git_commit", "git_dirty") if key in tags}, "config": config.to_dict(),
    }
    paths = write_results(out, header, results)
    if index_manifest is not None:
        paths["index_manifest"] = out / "index_manifest.json"
        atomic_write_json(paths["index_manifest"], index_manifest)
    if compiled:  # the compiled program travels with the results (and into the MLflow run)
        paths["program"] = out / "program.json"
        atomic_write_bytes(paths["program"], Path(compiled).read_bytes())
    print(results_table([r.summary for r in results.values()]), end="")
    print(f"results, predictions and the index manifest in {out}/")
    outcome = {"retrievers": {n: r.summary for n, r in results.items()}, "out": str(out), "mlflow_run": None}
    if config.tracking.enabled:
        from optimize.tracking import log_evaluation

        tags = {**tags, "hyperprove.lm": lm_id} if lm_id else tags
        outcome["mlflow_run"] = log_evaluation(config.tracking, config.to_dict(), outcome["retrievers"], paths, name, tags)
        atomic_write_json(paths["results"], {**read_json(paths["results"], "results"), "mlflow_run": outcome["mlflow_run"]})
        print(f"MLflow run {outcome['mlflow_run']} in {config.tracking.uri} (experiment {config.tracking.experiment!r}; `hyperprove ui` shows it)")
    return outcome


def cmd_sweep(args: argparse.Namespace) -> dict:
    from experiments.data import load_corpus, load_questions
    from experiments.gold import evaluate_ranker, hyperprove_chain
    from experiments.harness import timestamp
    from optimize import sweep as sweeping
    from optimize.tracking import active_run_id, git_state, metric_name, tracked_run
    from pipeline.files import atomic_write_json

    source = git_state(REPOSITORY)  # the code that runs: taken now, not when the sweep ends
    config = _config(args)
    run, sweep = config.evaluation, config.sweep
    if not run.questions or not run.corpus:
        raise HyperProveError("sweep: give --questions and --corpus (or a --config with evaluation.questions and evaluation.corpus)")
    with_lm = run.decomposition == "lm"
    if sweep.objective in ("f1", "em") and not with_lm:
        raise HyperProveError(f"--objective {sweep.objective} needs answers: use --decomposition lm")
    passages = load_corpus(run.corpus)
    questions = load_questions(run.questions, passages)[: run.limit]
    embedder = _embedder(config)
    session = LMSession(config) if with_lm else None
    index, _ = cached_index(passages, config, embedder, session)
    embedder.load()

    def score_chunk(params: dict, chunk) -> list[dict]:
        retriever = index.retriever(config.with_overrides(retriever=params).retriever, embedder.encode_query)
        if with_lm:
            from experiments.qa import evaluate_program

            return evaluate_program(chunk, _program(retriever, config), session.calls)[1]
        return evaluate_ranker(chunk, lambda question: hyperprove_chain(question, retriever))[1]

    def on_trial(trial, params: dict, scores: dict | None) -> None:
        if mlflow is not None:
            with mlflow.start_run(experiment_id=mlflow.active_run().info.experiment_id, run_name=f"trial-{trial.number}", nested=True):
                mlflow.log_params(params)
                mlflow.set_tag("optuna.state", "complete" if scores is not None else "pruned")
                if scores is not None:
                    mlflow.log_metrics({metric_name("hyperprove", key): value for key, value in scores.items()})

    def shown(scores: dict | None) -> str:
        return ", ".join(f"{key} {value:.2f}" for key, value in (scores or {}).items()) or "not scored"

    tags = {"hyperprove.kind": "sweep", "optuna.study": sweep.study, "optuna.storage": sweep.storage, **source}
    start = sweeping.starting_point(sweep, config.to_dict()["retriever"])
    with tracked_run(config.tracking, config.to_dict(), f"sweep-{sweep.study}", tags) as mlflow:
        study = sweeping.run_sweep(sweep, questions, score_chunk, on_trial, start=start)
        result = {**sweeping.summary(study), "objective": sweep.objective, "tie_break": sweep.tie_break, "questions": run.questions,
                  "n_questions": len(questions), "start_params": start, "start_scores": sweeping.trial_scores_of(study, start)}
        best_params = sweeping.best_parameters(study)
        best_out = Path(sweep.best_out or Path(".hyperprove") / "sweeps" / f"{sweep.study}-best.json")
        atomic_write_json(best_out, {"retriever": {**config.to_dict()["retriever"], **best_params}, "index": config.to_dict()["index"]})
        result["best_config"] = str(best_out)
        print(f"study {sweep.study!r} in {sweep.storage}: {result['complete']} complete, {result['pruned']} pruned; best trial "
              f"{result['best_trial']}: {shown(result['best_scores'])} with {best_params} -> {best_out}; "
              f"the configured parameters: {shown(result['start_scores'])}")
        # Is the best trial's margin more than the luck of picking the best of many on few questions?
        result["difference"] = sweeping.compare(sweep, score_chunk, start, best_params, questions)["difference"]
        print(f"best minus configured, question by question: {sweeping.describe_difference(result['difference'])}")
        if sweep.validate:  # the held-out check: do the best parameters beat the configured ones there?
            held_out = load_questions(sweep.validate, passages)
            result["validation"] = {"questions": sweep.validate, **sweeping.compare(sweep, score_chunk, start, best_params, held_out)}
            print(f"on {sweep.validate} ({len(held_out)} questions): best parameters {shown(result['validation']['best_scores'])}; "
                  f"configured ones {shown(result['validation']['start_scores'])}; "
                  f"best minus configured: {sweeping.describe_difference(result['validation']['difference'])}")
        out = Path(run.out or Path(".hyperprove") / "sweeps" / f"{sweep.study}-{timestamp()}")
        plots = sweeping.save_plots(study, out)
        if mlflow is not None:
            result["mlflow_run"] = active_run_id(mlflow)
        atomic_write_json(out / "sweep.json", {**result, "finished": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                               **source, "config": config.to_dict()})
        print(f"summary and plots in {out}/")
        result["out"] = str(out)
        if mlflow is not None:
            for path in [*plots, best_out, out / "sweep.json"]:
                mlflow.log_artifact(str(path))
            scored = {"best": result["best_scores"], "start": result["start_scores"]}
            if sweep.validate:
                scored.update({f"validation_{kind}": result["validation"][f"{kind}_scores"] for kind in ("best", "start")})
            for prefix, scores in scored.items():
                mlflow.log_metrics({metric_name(prefix, key): value for key, value in (scores or {}).items()})
    return result


def cmd_compile(args: argparse.Namespace) -> dict:
    from experiments.data import load_corpus, load_questions
    from experiments.harness import timestamp
    from optimize.compile import compile_program, save_program
    from optimize.tracking import active_run_id, git_state, tracked_run
    from pipeline.files import atomic_write_json, sha256_file
    from pipeline.lm import make_lm

    source = git_state(REPOSITORY)
    config = _config(args)
    settings = config.compile
    if not settings.questions or not settings.corpus:
        raise HyperProveError("compile: give --questions and --corpus (or a --config with compile.questions and compile.corpus)")
    passages = load_corpus(settings.corpus)
    questions = load_questions(settings.questions, passages)
    if settings.target != "program" and not any(q.decomposition for q in questions):
        raise HyperProveError(f"{settings.questions}: --target {settings.target} needs gold decompositions (MuSiQue's); none found")
    session = LMSession(config)
    retriever = None  # decompose and rewrite are compiled without retrieval
    if settings.target == "program":
        embedder = _embedder(config)
        index, _ = cached_index(passages, config, embedder, session)
        embedder.load()
        retriever = index.retriever(config.retriever, embedder.encode_query)
    program = _program(retriever, config)  # from --program, when given: compiling continues from it
    prompt_lm = make_lm(config.with_overrides(lm={"model": settings.prompt_lm}).lm) if settings.prompt_lm else None
    out = Path(settings.out or Path(".hyperprove") / "programs" / f"{settings.target}-{settings.optimizer}-{timestamp()}.json")
    print(f"compile: {settings.target} with {settings.optimizer} on {settings.questions}, LM {session.id}", flush=True)
    tags = {"hyperprove.kind": "compile", "hyperprove.lm": session.id, **source}
    with tracked_run(config.tracking, config.to_dict(), f"compile-{settings.target}-{settings.optimizer}", tags) as mlflow:
        if mlflow is not None:
            import mlflow.dspy  # the optimizer's settings, trainset, valset and compiled state go into this run

            mlflow.dspy.autolog(log_compiles=True, log_traces=False, log_traces_from_compile=False, log_traces_from_eval=False, silent=True)
        started = time.perf_counter()
        report = compile_program(program, settings, questions, session.lm, prompt_lm, threads=config.lm.concurrency)
        report.update(seconds=round(time.perf_counter() - started, 1), lm_calls=session.calls(), lm=session.id, program=str(out))
        save_program(program, out)
        if mlflow is not None:
            mlflow.log_metrics({f"val_{when}": report[f"val_{when}"] for when in ("before", "after") if report[f"val_{when}"] is not None})
            mlflow.log_artifact(str(out))
            report["mlflow_run"] = active_run_id(mlflow)
        record = out.with_suffix(".record.json")  # what made the program, beside it (the report reads it)
        atomic_write_json(record, {**report, "finished": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), **source,
                                   "program_sha256": sha256_file(out), "config": config.to_dict()})
    scores = f"; validation grade {report['val_before']} -> {report['val_after']} on {report['val_examples']} examples" if report["val_examples"] else ""
    if report.get("val_selects"):
        scores += f" ({settings.optimizer} also chose on them, so the second grade is optimistic: evaluate on dev to know)"
    print(f"compiled {settings.target} in {report['seconds']:.0f} s ({report['lm_calls']} LM calls){scores}")
    print(f"demos per predictor: {report['demos']}")
    print(f"program written to {out} (how it was made: {out.with_suffix('.record.json')}); use it with --program {out}")
    return report


def cmd_reproduce(args: argparse.Namespace) -> dict:
    import hashlib
    import tempfile

    from experiments.harness import timestamp
    from optimize.tracking import TIMING, metric_deltas, recorded_evaluation, same_index
    from pipeline.files import sha256_file

    tracking = _config(args).tracking
    recorded = recorded_evaluation(tracking, args.run_id)
    results = recorded["results"]
    config = HyperProveConfig.from_dict(results["config"], source=f"run {args.run_id}")
    run = config.evaluation
    name = f"{results.get('name') or 'evaluation'}-reproduce"
    out = args.out or str(Path(".hyperprove") / "results" / f"{name}-{timestamp()}")
    config = config.with_overrides(evaluation={"out": out, "name": name}, tracking={"uri": tracking.uri}, cache_dir=args.cache_dir)
    for kind in ("questions", "corpus"):
        path = getattr(run, kind)
        if not Path(path).is_file():
            raise HyperProveError(f"{path}: the {kind} file of run {args.run_id} is not here")
        if sha256_file(path) != results.get("data_sha256", {}).get(kind):
            raise HyperProveError(f"{path}: differs from the {kind} run {args.run_id} was evaluated on (sha256 mismatch); not reproducing")
    if results.get("git_commit"):
        from optimize.tracking import git_state

        now = git_state(REPOSITORY).get("git_commit")
        if now != results["git_commit"]:
            print(f"note: run {args.run_id} was made at commit {results['git_commit'][:10]}, this is {str(now)[:10]}")

    def check_index(manifest):
        if not same_index(recorded["index_manifest"], manifest):
            raise HyperProveError(f"the index differs from the one run {args.run_id} used (index manifest checksums); not reproducing")

    with tempfile.TemporaryDirectory() as scratch:
        if results.get("program_sha256"):  # rerun with the compiled program the run logged
            program = recorded["program"]
            if program is None or hashlib.sha256(program).hexdigest() != results["program_sha256"]:
                raise HyperProveError(f"run {args.run_id}: its compiled program.json artifact is missing or differs from the recorded sha256")
            (Path(scratch) / "program.json").write_bytes(program)
            config = config.with_overrides(program={"compiled": str(Path(scratch) / "program.json")})
        outcome = run_evaluation(config, tags={"hyperprove.reproduces": args.run_id}, check_index=check_index)
    deltas = metric_deltas(results["systems"], outcome["retrievers"])
    changed = {system: {k: d for k, d in values.items() if d != 0} for system, values in deltas.items()}
    changed = {system: values for system, values in changed.items() if values}
    if changed:
        for system, values in changed.items():
            print(f"{system}: " + ", ".join(f"{key} {delta:+.4g}" for key, delta in values.items()))
    else:
        print(f"reproduced run {args.run_id}: every metric identical ({', '.join(TIMING)} are wall-clock and not compared)")
    return {"run": args.run_id, "reproduction": outcome["mlflow_run"], "out": outcome["out"], "identical": not changed, "deltas": deltas}


def cmd_ui(args: argparse.Namespace) -> dict:
    import subprocess

    from optimize.tracking import ui_command

    config = _config(args)
    command, env = ui_command(config.tracking, args.host, args.port)
    url = f"http://{args.host}:{args.port}"
    print(f"MLflow UI over {config.tracking.uri} at {url} (Ctrl-C stops it)", flush=True)
    server = subprocess.Popen(command, env={**os.environ, **env})
    try:
        code = server.wait()
    except KeyboardInterrupt:
        server.terminate()
        code = server.wait()
    if code not in (0, -15, 130):
        raise HyperProveError(f"the MLflow server exited with status {code} (is port {args.port} free?)")
    return {"url": url, "tracking_uri": config.tracking.uri}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hyperprove", description="Answer-guided hypergraph expansion for multi-hop QA.")
    commands = parser.add_subparsers(dest="command", required=True)

    index = commands.add_parser("index", help="build a hypergraph index from a corpus")
    index.add_argument("corpus", help='corpus JSON: a list of {"title", "text"}')
    index.add_argument("--out", required=True, help="index directory to write")
    _add_config_flags(index, retriever=False)
    index.set_defaults(run=cmd_index)

    ask = commands.add_parser("ask", help="answer one question over an index and show the evidence chain")
    ask.add_argument("index", help="index directory (from `hyperprove index`)")
    ask.add_argument("question")
    _add_config_flags(ask)
    _add_program_flags(ask)
    ask.set_defaults(run=cmd_ask)

    demo = commands.add_parser("demo", help="index a small shipped corpus with the LM and answer three multi-hop questions")
    _add_config_flags(demo, extractor="lm")
    _add_program_flags(demo)
    demo.set_defaults(run=cmd_demo)

    evaluate = commands.add_parser("evaluate", help="run retrievers on a question set: Recall@2/@5 (and EM/F1 with an LM), one MLflow run")
    evaluate.add_argument("--questions", help="questions JSON (project schema or HippoRAG's)")
    evaluate.add_argument("--corpus", help="corpus JSON the questions refer to")
    evaluate.add_argument("--index", help="index directory built from that corpus (default: built and cached)")
    evaluate.add_argument(
        "--retriever", dest="retrievers",
        help="comma-separated systems, run in one invocation over one index: dense | bm25 | ppr (HippoRAG 2-style) | "
             "proprag (beam search over fact paths) | dense-facts | hypergraphrag (one-shot entity expansion) | "
             "hyperprove-fixed (ablation) | dense-iterative | hyperprove (default: dense)",
    )
    evaluate.add_argument(
        "--decomposition", choices=["gold", "lm"],
        help="gold (default): MuSiQue's sub-questions, retrieval only; lm: hyperprove runs the full program (EM, F1, LM calls)",
    )
    evaluate.add_argument("--read", action="store_const", const=True, help="with --decomposition lm: every other system's top 5 passages go to the same reader")
    evaluate.add_argument("--limit", type=int, help="evaluate the first N questions only")
    evaluate.add_argument("--out", help="results directory: results.md, results.json, predictions.json, index_manifest.json")
    _add_tracking_flags(evaluate, "an MLflow run")
    _add_config_flags(evaluate)
    _add_program_flags(evaluate)
    evaluate.set_defaults(run=cmd_evaluate)

    sweep = commands.add_parser("sweep", help="Optuna TPE over alpha, theta, L and K; resumable study, MLflow runs per trial")
    sweep.add_argument("--questions", help="questions JSON to optimise on (a train split)")
    sweep.add_argument("--corpus", help="corpus JSON the questions refer to")
    sweep.add_argument("--decomposition", choices=["gold", "lm"], help="gold (default): MuSiQue's sub-questions; lm: the full program (for F1/EM)")
    sweep.add_argument("--limit", type=int, help="the first N questions only")
    sweep.add_argument("--trials", type=int, help="finished trials the study should reach (default 30; a rerun continues)")
    sweep.add_argument("--objective", choices=["recall@5", "recall@2", "f1", "em"], help="maximised (default recall@5)")
    sweep.add_argument("--storage", help="Optuna storage URL (default sqlite:///.hyperprove/optuna.db)")
    sweep.add_argument("--study", help="study name (default hyperprove)")
    sweep.add_argument("--seed", type=int, help="TPE seed (default 0)")
    sweep.add_argument("--best-out", help="experiment config to write with the best parameters")
    sweep.add_argument("--validate", help="held-out questions (e.g. dev) to score the best and the configured parameters on afterwards")
    sweep.add_argument("--out", help="folder for sweep.json (summary, validation) and the plots")
    _add_tracking_flags(sweep, "MLflow runs")
    _add_config_flags(sweep, retriever=False)
    _add_program_flags(sweep)
    sweep.set_defaults(run=cmd_sweep)

    compile_ = commands.add_parser("compile", help="compile the LM steps with a DSPy optimizer on training questions; writes the program JSON")
    compile_.add_argument("--questions", help="training questions JSON (MuSiQue's carry the gold decompositions decompose and rewrite need)")
    compile_.add_argument("--corpus", help="corpus JSON the questions refer to")
    compile_.add_argument("--target", choices=["decompose", "rewrite", "program"],
                          help="decompose (default) or rewrite: supervised by gold decompositions; program: every predictor, against answer F1")
    compile_.add_argument("--optimizer", choices=["bootstrap", "mipro", "gepa"], help="BootstrapFewShot (default), MIPROv2 or GEPA")
    compile_.add_argument("--train", type=int, help="the first N examples to compile on (default 20)")
    compile_.add_argument("--val", type=int, help="the next N examples, graded before and after (default 20; 0: none)")
    compile_.add_argument("--demos", type=int, dest="max_bootstrapped_demos", help="bootstrapped demonstrations per predictor (default 2)")
    compile_.add_argument("--labeled-demos", type=int, dest="max_labeled_demos", help="gold examples as demonstrations (default 2; decompose, rewrite)")
    compile_.add_argument("--threshold", type=float, help="grade a bootstrapped trace must reach (default: 0.6 decompose, 0.8 rewrite, 0.5 program)")
    compile_.add_argument("--auto", choices=["light", "medium", "heavy"], help="MIPROv2/GEPA budget (default light)")
    compile_.add_argument("--budget", type=int, help="instead of --auto, a fixed small budget: GEPA's metric calls, or MIPROv2's candidates and trials")
    compile_.add_argument("--prompt-lm", help="LiteLLM id that proposes instructions (MIPROv2) or reflects (GEPA); default: --lm")
    compile_.add_argument("--seed", type=int, help="optimizer seed (default 0)")
    compile_.add_argument("--out", help="compiled program JSON to write")
    _add_tracking_flags(compile_, "an MLflow run")
    _add_config_flags(compile_)
    _add_program_flags(compile_)
    compile_.set_defaults(run=cmd_compile)

    reproduce = commands.add_parser("reproduce", help="rerun a tracked evaluate run from its record and print the metric deltas")
    reproduce.add_argument("run_id", help="MLflow run id (printed by `hyperprove evaluate`, listed by `hyperprove ui`)")
    _add_tracking_flags(reproduce)
    reproduce.add_argument("--cache-dir", help="cache dir to use instead of the recorded one (the LM cache makes a rerun exact)")
    reproduce.add_argument("--out", help="results directory of the reproduction")
    reproduce.add_argument("--json", action="store_true", help="end with one JSON object")
    reproduce.set_defaults(run=cmd_reproduce)

    ui = commands.add_parser("ui", help="the MLflow UI over the project's tracking store (loopback, one worker)")
    ui.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1: this machine only)")
    ui.add_argument("--port", type=int, default=5000)
    _add_tracking_flags(ui)
    ui.add_argument("--config", help="experiment config file (JSON) whose tracking section to use")
    ui.add_argument("--json", action="store_true", help="end with one JSON object")
    ui.set_defaults(run=cmd_ui)
    return parser


def main(argv: list[str] | None = None) -> int:
    for name, value in LIBRARY_DEFAULTS.items():
        os.environ.setdefault(name, value)
    args = build_parser().parse_args(argv)
    try:
        result = args.run(args)
    except HyperProveError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: finished work is cached; run the same command again to resume", file=sys.stderr)
        return 130
    except Exception as error:  # an LM provider's failure (bad key, no server, quota) is bad input too
        from dspy.utils.exceptions import LMError

        if not isinstance(error, LMError) and type(error).__module__.split(".")[0] not in LM_ERROR_MODULES:
            raise
        first_line = (str(error).strip().splitlines() or [""])[0][:300]
        print(f"error: the LM failed ({type(error).__name__}): {first_line}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
