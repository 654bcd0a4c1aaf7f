"""The `hyperprove` command line: a shell over the Python API.

Each command parses its flags, builds the one config, calls one public function of the folder
that owns the work (`pipeline`, `experiments`, `optimize`) and prints. Those functions import
what they need when called, so `--help` loads no model library. Every command takes --json (one
JSON object as the last line of output); bad input exits 2 with a one-line `error: ...` message.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from typing import Callable

from modules.config import TUNABLES, tunable_type
from modules.errors import HyperProveError, first_line
from pipeline.config import ADAPTERS, BRIDGE_REWRITES, EXTRACTORS, READER_EVIDENCE, HyperProveConfig

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

EVALUATION_FLAGS = ("questions", "corpus", "index", "retrievers", "decomposition", "read", "limit", "out")
SWEEP_FLAGS = ("trials", "objective", "storage", "study", "seed", "best_out", "validate", "transfer_questions", "transfer_corpus")
COMPILE_FLAGS = ("questions", "corpus", "target", "optimizer", "train", "val", "max_bootstrapped_demos", "max_labeled_demos",
                 "threshold", "auto", "budget", "prompt_lm", "seed", "keep_builtin", "out")


def build_config(args: argparse.Namespace) -> HyperProveConfig:
    """The config file (if any) with the flags on top."""
    path = getattr(args, "config", None)
    base = HyperProveConfig.from_file(path) if path else HyperProveConfig()
    flag = lambda name: getattr(args, name, None)  # noqa: E731
    return base.with_overrides(
        retriever={name: flag(name) for name in TUNABLES},
        index={"extractor": flag("extractor"), "embedder": flag("embedder"), "eta": flag("eta")},
        lm={"model": flag("lm_model"), "threads": flag("lm_threads"), "adapter": flag("lm_adapter")},
        program={"max_hops": flag("max_hops"), "compiled": flag("program"), "entity_retries": flag("entity_retries"),
                 "grounded_hops": flag("grounded_hops"), "question_channel": flag("question_channel"),
                 "reader_evidence": flag("reader_evidence"), "comparison_demos": flag("comparison_demos"),
                 "bridge_rewrite": flag("bridge_rewrite"), "grounded_in": flag("grounded_in"),
                 "choose_options": flag("choose_options"), "fold_identities": flag("fold_identities")},
        evaluation={k: flag(k) for k in EVALUATION_FLAGS} if args.command in ("evaluate", "sweep") else {},
        sweep={k: flag(k) for k in SWEEP_FLAGS} if args.command == "sweep" else {},
        compile={k: flag(k) for k in COMPILE_FLAGS} if args.command == "compile" else {},
        tracking={"uri": flag("tracking_uri"), "enabled": flag("track"), "traces": flag("traces")},
        cache_dir=flag("cache_dir"),
    )


# --- the commands: config -> one call -----------------------------------------------------------------
def cmd_index(args, make_runtime) -> dict:
    from pipeline.index_commands import add_to_index, delete_from_index, index_corpus

    config = build_config(args)
    if args.add or args.delete:
        if args.corpus or args.out or not args.into or (args.add and args.delete):
            raise HyperProveError("index --add NEW.json or --delete IDS.json (one of them) takes --into DIR (the index to change), and no corpus or --out")
        change = add_to_index if args.add else delete_from_index
        return change(args.add or args.delete, args.into, config, make_runtime(config))
    if not args.corpus or not args.out or args.into:
        raise HyperProveError("index: give a corpus and --out DIR (or --add NEW.json / --delete IDS.json --into DIR to change an index)")
    return index_corpus(args.corpus, args.out, config, make_runtime(config))


def cmd_ask(args, make_runtime) -> dict:
    from pipeline.program import ask

    config = build_config(args)
    return ask(config, args.index, args.question, make_runtime(config), profile=args.profile, html=args.html)


def calls(target: str) -> Callable:
    """The command that builds the config and calls `module:function(config, runtime)`, imported
    only then (demo, evaluate, sweep, compile)."""

    def command(args, make_runtime) -> dict:
        module, function = target.split(":")
        config = build_config(args)
        return getattr(importlib.import_module(module), function)(config, make_runtime(config))

    return command


def cmd_demo(args, make_runtime) -> dict:
    from experiments.demonstration import run_demo, write_demo_facts

    config = build_config(args)
    return (write_demo_facts if args.write_facts else run_demo)(config, make_runtime(config))


def cmd_evaluate(args, make_runtime) -> dict:
    from experiments.evaluate import run_evaluation
    from optimize.tracking import evaluation_tracker

    config = build_config(args)
    return run_evaluation(config, make_runtime(config), track=evaluation_tracker(config))


def cmd_reproduce(args, make_runtime) -> dict:
    from optimize.reproduce import reproduce

    return reproduce(args.run_id, build_config(args).tracking, args.out, args.cache_dir, args.trust_record, make_runtime)


def cmd_ui(args, make_runtime) -> dict:
    from optimize.tracking import serve_ui

    return serve_ui(build_config(args).tracking, args.host, args.port, args.allow_remote)


# --- flags -----------------------------------------------------------------------------------------------
def _add_config_flags(parser: argparse.ArgumentParser, retriever: bool = True, extractor: str = "sentences") -> None:
    parser.add_argument("--config", help="experiment config file (JSON); flags override it")
    parser.add_argument("--extractor", choices=list(EXTRACTORS),
                        help=f"fact extractor (default: {extractor}): " + "; ".join(f"{k}: {v}" for k, v in EXTRACTORS.items()))
    parser.add_argument("--embedder", help="embedder id (default: all-MiniLM-L6-v2, from its package)")
    parser.add_argument("--eta", type=float, help="synonym cosine threshold (default 0.8)")
    parser.add_argument("--cache-dir", help="embeddings, indexes, LM extractions and LM calls (default .hyperprove/cache)")
    if retriever:
        for name, tunable in TUNABLES.items():
            parser.add_argument(tunable.flag, type=tunable_type(name), dest=name, help=tunable.help)
    parser.add_argument("--lm", dest="lm_model", help="LiteLLM model id, e.g. openai/gpt-4o-mini (default: the embedded local model)")
    parser.add_argument("--lm-threads", type=int, help="concurrent LM requests (default: 1 for the local model, 8 for an API model)")
    parser.add_argument("--lm-adapter", choices=list(ADAPTERS), help="prompt layout: " + "; ".join(f"{k}: {v}" for k, v in ADAPTERS.items()))
    parser.add_argument("--json", action="store_true", help="end with one JSON object")


def _add_tracking_flags(parser: argparse.ArgumentParser, logs: str | None = None, traces: bool = False) -> None:
    """--tracking-uri, --no-track for commands that log `logs` (one run, or runs), and --no-trace
    for commands whose LM questions are traced."""
    parser.add_argument("--tracking-uri", help="MLflow tracking store (default sqlite:///.hyperprove/mlflow.db)")
    if logs:
        parser.add_argument("--no-track", action="store_const", const=False, dest="track", help=f"do not log {logs}")
    if traces:
        parser.add_argument("--no-trace", action="store_const", const=False, dest="traces",
                            help="no MLflow trace per question (the LM's prompts and outputs, the retriever's trace)")


def _add_program_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--program", help="compiled program JSON (from `hyperprove compile`)")
    parser.add_argument("--max-hops", type=int, help="most sub-questions per question (default 4)")
    parser.add_argument("--entity-retries", type=int, help="asks again for a decomposition that drops or invents a name of the question (0: no check)")
    parser.add_argument("--grounded-hops", action=argparse.BooleanOptionalAction,
                        help="a hop answer its facts do not contain is asked again, then replaced by a span of the facts of the kind asked for")
    parser.add_argument("--question-channel", action=argparse.BooleanOptionalAction,
                        help="interleave the ranking for the whole question first with the hops' rankings")
    parser.add_argument("--comparison-demos", action=argparse.BooleanOptionalAction,
                        help="Decompose also shows two comparisons and is asked to keep the question's names")
    parser.add_argument("--reader-evidence", choices=list(READER_EVIDENCE),
                        help="what the final reader sees: " + "; ".join(f"{k}: {v}" for k, v in READER_EVIDENCE.items()))
    parser.add_argument("--grounded-in", choices=["cited", "evidence"],
                        help="with --grounded-hops, where a hop answer must occur: the facts the hop reader cited, or any of the hop's facts")
    parser.add_argument("--choose-options", action=argparse.BooleanOptionalAction,
                        help="a final answer that is none of the options the question names (\"..., A or B?\") is asked for again as a choice")
    parser.add_argument("--fold-identities", action=argparse.BooleanOptionalAction,
                        help="drop sub-questions that only ask who a named thing is (\"Who is X?\"), writing X where later ones refer to them")
    parser.add_argument("--bridge-rewrite", choices=list(BRIDGE_REWRITES),
                        help="how a sub-question's #k become earlier answers: " + "; ".join(f"{k}: {v}" for k, v in BRIDGE_REWRITES.items()))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hyperprove", description="Answer-guided hypergraph expansion for multi-hop QA.")
    commands = parser.add_subparsers(dest="command", required=True)

    index = commands.add_parser("index", help="build a hypergraph index from a corpus, or add passages to one or delete them from it")
    index.add_argument("corpus", nargs="?", help='corpus JSON: a list of {"title", "text"}')
    index.add_argument("--out", help="index directory to write (new, empty, or an earlier index)")
    index.add_argument("--add", metavar="NEW.json", help="passages to append to the index given by --into (only they are extracted and embedded)")
    index.add_argument("--delete", metavar="IDS.json", help="a JSON list of passage ids and/or titles to take out of the index given by --into")
    index.add_argument("--into", metavar="DIR", help="the index that --add grows or --delete shrinks, in place and atomically")
    _add_config_flags(index, retriever=False)
    index.set_defaults(run=cmd_index)

    ask = commands.add_parser("ask", help="answer one question over an index and show the evidence chain")
    ask.add_argument("index", help="index directory (from `hyperprove index`)")
    ask.add_argument("question")
    ask.add_argument("--profile", action="store_true", help="print what each LM step cost: calls, prompt tokens (and those the server's prompt cache served), generated tokens, seconds")
    ask.add_argument("--html", metavar="FILE", help="also write the evidence chain as a self-contained HTML page")
    _add_config_flags(ask)
    _add_program_flags(ask)
    _add_tracking_flags(ask, "the question's MLflow trace", traces=True)
    ask.set_defaults(run=cmd_ask)

    demo = commands.add_parser("demo", help="index a small shipped corpus with the LM and answer three multi-hop questions")
    _add_config_flags(demo, extractor="lm")
    _add_program_flags(demo)
    demo.add_argument("--write-facts", action="store_true", help="extract the demo corpus afresh with the LM and write experiments/demo/facts.json")
    _add_tracking_flags(demo, "the questions' MLflow traces", traces=True)
    demo.set_defaults(run=cmd_demo, extractor="lm")  # the demo shows the LM extractor

    evaluate = commands.add_parser("evaluate", help="run retrievers on a question set: Recall@2/@5 (and EM/F1 with an LM), one MLflow run")
    evaluate.add_argument("--questions", help="questions JSON (project schema or HippoRAG's)")
    evaluate.add_argument("--corpus", help="corpus JSON the questions refer to")
    evaluate.add_argument("--index", help="index directory built from that corpus (default: built and cached)")
    evaluate.add_argument(
        "--retriever", dest="retrievers",
        help="comma-separated systems, run in one invocation over one index: dense | bm25 | ppr (HippoRAG 2-style) | "
             "proprag (beam search over fact paths) | dense-facts | hypergraphrag (one-shot entity expansion) | "
             "hyperprove-fixed (ablation) | dense-iterative | hyperprove | "
             "hyperprove-passages (the program's top 5 through the same reader) (default: dense)",
    )
    evaluate.add_argument(
        "--decomposition", choices=["gold", "lm"],
        help="gold (default): the datasets' gold sub-questions, retrieval only; lm: hyperprove runs the full program (EM, F1, LM calls)",
    )
    evaluate.add_argument("--read", action=argparse.BooleanOptionalAction,
                          help="with --decomposition lm: every other system's top 5 passages go to the same reader (default: on)")
    evaluate.add_argument("--limit", type=int, help="evaluate the first N questions only")
    evaluate.add_argument("--out", help="results directory: results.md, results.json, predictions.json, index_manifest.json")
    _add_tracking_flags(evaluate, "an MLflow run", traces=True)
    _add_config_flags(evaluate)
    _add_program_flags(evaluate)
    evaluate.set_defaults(run=cmd_evaluate)

    sweep = commands.add_parser("sweep", help="Optuna TPE over alpha, theta, L and K; resumable study, MLflow runs per trial")
    sweep.add_argument("--questions", help="questions JSON to optimise on (a train split)")
    sweep.add_argument("--corpus", help="corpus JSON the questions refer to")
    sweep.add_argument("--decomposition", choices=["gold", "lm"], help="gold (default): gold sub-questions; lm: the full program (for F1/EM)")
    sweep.add_argument("--limit", type=int, help="the first N questions only")
    sweep.add_argument("--trials", type=int, help="finished trials the study should reach, all workers together (default 30; a rerun continues)")
    sweep.add_argument("--objective", choices=["recall@5", "recall@2", "f1", "em"], help="maximised (default recall@5)")
    sweep.add_argument("--storage", help="Optuna storage URL (default sqlite:///.hyperprove/optuna.db); several workers may share one")
    sweep.add_argument("--study", help="study name (default hyperprove)")
    sweep.add_argument("--seed", type=int, help="TPE seed (default 0)")
    sweep.add_argument("--best-out", help="experiment config to write with the best parameters")
    sweep.add_argument("--validate", help="held-out questions (e.g. dev) to score the best and the configured parameters on afterwards")
    sweep.add_argument("--transfer-questions", help="held-out questions over another corpus (with --transfer-corpus): does the best setting carry over?")
    sweep.add_argument("--transfer-corpus", help="the corpus --transfer-questions refer to")
    sweep.add_argument("--out", help="folder for sweep.json (summary, validation) and the plots")
    _add_tracking_flags(sweep, "MLflow runs")
    _add_config_flags(sweep, retriever=False)
    _add_program_flags(sweep)
    sweep.set_defaults(run=calls("optimize.sweep:run_sweep"))

    compile_ = commands.add_parser("compile", help="compile the LM steps with a DSPy optimizer on training questions; writes the program JSON")
    compile_.add_argument("--questions", help="training questions JSON (MuSiQue's and 2Wiki's carry the gold decompositions decompose and rewrite need)")
    compile_.add_argument("--corpus", help="corpus JSON the questions refer to")
    compile_.add_argument("--target", choices=["decompose", "rewrite", "program"],
                          help="decompose (default) or rewrite: supervised by gold decompositions; program: every predictor, against answer F1")
    compile_.add_argument("--optimizer", choices=["bootstrap", "mipro", "gepa"], help="BootstrapFewShot (default), MIPROv2 or GEPA")
    compile_.add_argument("--train", type=int, help="the first N examples to compile on (default 20)")
    compile_.add_argument("--val", type=int, help="the next N examples, graded before and after (default 20; 0: none)")
    compile_.add_argument("--demos", type=int, dest="max_bootstrapped_demos", help="bootstrapped demonstrations per predictor (default 2)")
    compile_.add_argument("--labeled-demos", type=int, dest="max_labeled_demos", help="gold examples as demonstrations (default 2; decompose, rewrite); 0: the teacher answers with the program's own demonstrations, and only its graded traces are kept")
    compile_.add_argument("--keep-builtin-demos", action="store_const", const=True, dest="keep_builtin",
                          help="keep the built-in demonstrations, ahead of the compiled ones (default: the compiled ones replace them)")
    compile_.add_argument("--threshold", type=float, help="grade a bootstrapped trace must reach (default: 0.6 decompose, 0.8 rewrite, 0.5 program)")
    compile_.add_argument("--auto", choices=["light", "medium", "heavy"], help="MIPROv2/GEPA budget (default light)")
    compile_.add_argument("--budget", type=int, help="instead of --auto, a fixed small budget: GEPA's metric calls, or MIPROv2's candidates and trials")
    compile_.add_argument("--prompt-lm", help="LiteLLM id that proposes instructions (MIPROv2) or reflects (GEPA); default: --lm")
    compile_.add_argument("--seed", type=int, help="optimizer seed (default 0)")
    compile_.add_argument("--out", help="compiled program JSON to write")
    _add_tracking_flags(compile_, "an MLflow run")
    _add_config_flags(compile_)
    _add_program_flags(compile_)
    compile_.set_defaults(run=calls("optimize.compile:run_compile"))

    reproduce = commands.add_parser("reproduce", help="rerun a tracked evaluate run from its record and print the metric deltas")
    reproduce.add_argument("run_id", help="MLflow run id (printed by `hyperprove evaluate`, listed by `hyperprove ui`)")
    _add_tracking_flags(reproduce)
    reproduce.add_argument("--cache-dir", help="cache dir to use (default .hyperprove/cache; the LM cache makes a rerun exact)")
    reproduce.add_argument("--out", help="results directory of the reproduction")
    reproduce.add_argument("--trust-record", action="store_true",
                           help="also take the record's LM, API endpoint and cache dir (a record names them; by default they are refused or replaced)")
    reproduce.add_argument("--json", action="store_true", help="end with one JSON object")
    reproduce.set_defaults(run=cmd_reproduce)

    ui = commands.add_parser("ui", help="the MLflow UI over the project's tracking store (loopback, one worker)")
    ui.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1: this machine only)")
    ui.add_argument("--port", type=int, default=5000)
    ui.add_argument("--allow-remote", action="store_true", help="allow a --host other than loopback (the server has no authentication)")
    _add_tracking_flags(ui)
    ui.add_argument("--config", help="experiment config file (JSON) whose tracking section to use")
    ui.add_argument("--json", action="store_true", help="end with one JSON object")
    ui.set_defaults(run=cmd_ui)
    return parser


def main(argv: list[str] | None = None, make_runtime: Callable | None = None) -> int:
    """Run one command. `make_runtime(config)` gives the LM and embedder it runs with (default
    `pipeline.runtime.Runtime`: the configured ones); tests pass scripted ones."""
    from pipeline.runtime import Runtime

    for name, value in LIBRARY_DEFAULTS.items():
        os.environ.setdefault(name, value)
    args = build_parser().parse_args(argv)
    try:
        result = args.run(args, make_runtime or Runtime)
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
        print(f"error: the LM failed ({type(error).__name__}): {first_line(error, 300)}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
