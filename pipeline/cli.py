"""The `hyperprove` command line: a shell over the Python API.

Each command parses its flags, builds the one config, calls one public function of the folder
that owns the work (`pipeline`, `experiments`, `optimize`) and prints. Those functions import
what they need when called, so `--help` loads no model library. Every command takes --json (one
JSON object as the last line of output); bad input exits 2 with a one-line `error: ...` message.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import sys
import types
import typing
from typing import Callable

from modules.config import TUNABLES
from modules.errors import HyperProveError, UnrecordedCall, first_line
from pipeline.config import _SECTIONS, ADAPTERS, BRIDGE_REWRITES, CHOOSE, EXTRACTORS, READER_EVIDENCE, HyperProveConfig

LM_ERROR_MODULES = {"litellm", "openai", "httpx", "httpcore"}  # besides DSPy's own LMError

TOP_LEVEL = "cache_dir"  # the one config field outside a section


def config_flag(parser: argparse.ArgumentParser, flag: str, target: str, help: str, shown: str | None = None, **options) -> None:
    """A flag that sets `target` ("section.field", or "cache_dir") of the config. Its type, its
    choices and the default its help names come from the field itself, so they cannot drift from
    the config; `shown` words a default that is not a plain value (None that means "the embedded
    model"). Unset, the flag leaves the config file's value (or the field's default) alone."""
    section, _, name = target.rpartition(".")
    owner = _SECTIONS[section] if section else HyperProveConfig
    annotation = typing.get_type_hints(owner)[name]
    if hasattr(owner, "__pydantic_fields__"):
        default = owner.__pydantic_fields__[name].get_default(call_default_factory=True)
    else:
        default = next(f.default for f in dataclasses.fields(owner) if f.name == name)
    options.setdefault("dest", target)
    union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    kinds = [kind for kind in typing.get_args(annotation) if kind is not type(None)] if union else [annotation]
    if typing.get_origin(kinds[0]) is typing.Literal:
        options.setdefault("choices", list(typing.get_args(kinds[0])))
    elif kinds[0] is bool:
        options.setdefault("action", argparse.BooleanOptionalAction)
    elif "action" not in options:
        options.setdefault("metavar", name.upper())
        if kinds[0] in (int, float):
            options.setdefault("type", kinds[0])
    if shown is None and default is not None:
        shown = {True: "on", False: "off"}.get(default, default) if isinstance(default, bool) else default
    parser.add_argument(flag, help=help + (f" (default: {shown})" if shown is not None else ""), **options)


def build_config(args: argparse.Namespace) -> HyperProveConfig:
    """The config file (if any) with the flags that were given on top (`config_flag`)."""
    path = getattr(args, "config", None)
    base = HyperProveConfig.from_file(path, trusted=getattr(args, "trust_config", False)) if path else HyperProveConfig()
    overrides: dict[str, dict] = {name: {} for name in _SECTIONS}
    top = {}
    for target, value in vars(args).items():
        section, _, name = target.rpartition(".")
        if value is not None and section in _SECTIONS:
            overrides[section][name] = value
        elif value is not None and target == TOP_LEVEL:
            top[target] = value
    return base.with_overrides(**overrides, **top)


# --- the commands: config -> one call -----------------------------------------------------------------
def cmd_index(args, make_runtime) -> dict:
    from pipeline.index.commands import add_to_index, delete_from_index, index_corpus

    config = build_config(args)
    if args.add or args.delete:
        if args.corpus or args.out or not args.into or (args.add and args.delete):
            raise HyperProveError("index --add NEW or --delete WHAT (one of them) takes --into DIR (the index to change), and no corpus or --out")
        if args.delete:
            return delete_from_index(args.delete, args.into, config, make_runtime(config))
        return add_to_index(args.add, args.into, config, make_runtime(config), make_runtime=make_runtime)
    if not args.corpus or not args.out or args.into:
        raise HyperProveError("index: give a corpus or a folder and --out DIR (or --add NEW / --delete WHAT --into DIR to change an index)")
    return index_corpus(args.corpus, args.out, config, make_runtime(config), make_runtime=make_runtime)


def cmd_ask(args, make_runtime) -> dict:
    from pipeline.serve.ask import ask

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
    from experiments.runs.evaluate import run_evaluation
    from experiments.runs.tracking import evaluation_tracker

    config = build_config(args)
    return run_evaluation(config, make_runtime(config), track=evaluation_tracker(config), make_runtime=make_runtime)


def cmd_reproduce(args, make_runtime) -> dict:
    from experiments.runs.reproduce import reproduce

    return reproduce(args.source, build_config(args).tracking, args.out, getattr(args, TOP_LEVEL), args.trust_record, make_runtime,
                     live=args.live)


def cmd_pages(args, make_runtime) -> dict:
    from experiments.runs.pages import run_pages

    return run_pages(args.folder, args.out)


def cmd_serve(args, make_runtime) -> dict:
    from pipeline.serve.server import serve, served_config

    config = served_config(build_config(args))
    return serve(config, args.index, args.host, args.port, args.allow_remote, make_runtime(config))


def cmd_serve_lm(args, make_runtime) -> dict:
    from pipeline.lm.local import serve_local_model

    return serve_local_model(build_config(args).lm, args.host, args.port, args.allow_remote)


def cmd_ui(args, make_runtime) -> dict:
    from experiments.runs.tracking import serve_ui

    return serve_ui(build_config(args).tracking, args.host, args.port, args.allow_remote)


# --- flags -----------------------------------------------------------------------------------------------
def _add_config_file(parser: argparse.ArgumentParser, what: str = "experiment config file (JSON); flags override it") -> None:
    parser.add_argument("--config", help=what)
    parser.add_argument("--trust-config", action="store_true",
                        help="the --config file is your own: it may also name the LM endpoint, tracking store, study storage, "
                             "an embedder folder and outputs outside this folder (a shared config may not)")


def _add_config_flags(parser: argparse.ArgumentParser, retriever: bool = True, extractor: str | None = None) -> None:
    _add_config_file(parser)
    config_flag(parser, "--extractor", "index.extractor", "fact extractor: " + "; ".join(f"{k}: {v}" for k, v in EXTRACTORS.items()),
                shown=extractor)
    config_flag(parser, "--sentence-rules", "index.sentence_rules", "the sentences extractor's rules: 2 line by line, a code block "
                "whole, no fragments; 1 as runs recorded before 2 existed")
    config_flag(parser, "--embedder", "index.embedder", "embedder id (from its package)")
    config_flag(parser, "--eta", "index.eta", "synonym cosine threshold (step 2)")
    config_flag(parser, "--cache-dir", TOP_LEVEL, "embeddings, indexes, LM extractions and LM calls")
    if retriever:
        for name, tunable in TUNABLES.items():
            config_flag(parser, tunable.flag, f"retriever.{name}", tunable.help)
    config_flag(parser, "--lm", "lm.model", "LiteLLM model id, e.g. openai/gpt-4o-mini", shown="the embedded local model")
    config_flag(parser, "--api-base", "lm.api_base",
                "OpenAI-compatible endpoint (http://host:port/v1): with --lm, that model's server; without, the embedded model "
                "served by `hyperprove serve-lm`; several, comma-separated, are spread over a Ray run's workers", shown="none")
    config_flag(parser, "--lm-threads", "lm.threads", "concurrent LM requests", shown="1 for the local model, 8 for an API model")
    config_flag(parser, "--deterministic", "lm.deterministic",
                "local model: every request computes its whole prompt (no prompt cache), so the same prompt gets the same "
                "answer (retries are seeded); about three times the seconds a question")
    config_flag(parser, "--pin-prefixes", "lm.pin_prefixes",
                "local model: each request starts from its prefix's saved state (instructions and demonstrations, computed once), "
                "so the same request gets the same answer whatever ran before it")
    config_flag(parser, "--replay", "lm.replay",
                "answer the LM calls from a results folder's recorded calls (lm_calls.jsonl.gz), or several folders' (comma-separated); "
                "a call not there stops the run",
                shown="none")
    config_flag(parser, "--live", "lm.live", "with --replay, send calls the record lacks to the LM (only those an option changes are new)")
    config_flag(parser, "--lm-timeout", "lm.timeout", "seconds an LM request may go without its reply before it has failed",
                shown="300; serve: 120")
    config_flag(parser, "--lm-retries", "lm.retries", "times a failed LM request is sent again",
                shown="8 for an API model or --api-base, 2 for the embedded model; serve: 1")
    config_flag(parser, "--lm-adapter", "lm.adapter", "prompt layout: " + "; ".join(f"{k}: {v}" for k, v in ADAPTERS.items()),
                shown="lean-prefilled on the local model, chat on an API model")
    parser.add_argument("--json", action="store_true", help="end with one JSON object")


def _add_cluster_flags(parser: argparse.ArgumentParser, work: str) -> None:
    config_flag(parser, "--ray", "cluster.ray",
                f"{work} on Ray workers: a cluster address (auto: the one `ray start` runs here), or local (one started in "
                "this process); needs the [ray] extra", shown="here, in one process", nargs="?", const="local", metavar="ADDRESS")
    config_flag(parser, "--ray-workers", "cluster.workers", "Ray workers", shown="one per CPU of the cluster", metavar="N")


def _add_tracking_flags(parser: argparse.ArgumentParser, logs: str | None = None, traces: bool = False) -> None:
    """--tracking-uri, --no-track for commands that log `logs` (one run, or runs), and --no-trace
    for commands whose LM questions are traced."""
    config_flag(parser, "--tracking-uri", "tracking.uri", "MLflow tracking store")
    if logs:
        parser.add_argument("--no-track", action="store_const", const=False, dest="tracking.enabled", help=f"do not log {logs}")
    if traces:
        parser.add_argument("--no-trace", action="store_const", const=False, dest="tracking.traces",
                            help="no MLflow trace per question (the LM's prompts and outputs, the retriever's trace)")


def _add_program_flags(parser: argparse.ArgumentParser) -> None:
    config_flag(parser, "--program", "program.compiled", "compiled program JSON (from `hyperprove compile`)",
                shown="the built-in demonstrations")
    config_flag(parser, "--max-hops", "program.max_hops", "most sub-questions per question")
    config_flag(parser, "--entity-retries", "program.entity_retries",
                "asks again for a decomposition that drops or invents a name of the question (0: no check)")
    config_flag(parser, "--grounded-hops", "program.grounded_hops",
                "a hop answer its facts do not contain is asked again, then replaced by a span of the facts of the kind asked for")
    config_flag(parser, "--question-channel", "program.question_channel",
                "interleave the ranking for the whole question first with the hops' rankings")
    config_flag(parser, "--comparison-demos", "program.comparison_demos",
                "Decompose also shows two comparisons and is asked to keep the question's names")
    config_flag(parser, "--decompose-facts", "program.decompose_facts",
                "the decomposer also reads this many top facts found for the whole question (0: the question alone)")
    config_flag(parser, "--reader-evidence", "program.reader_evidence",
                "what the final reader sees: " + "; ".join(f"{k}: {v}" for k, v in READER_EVIDENCE.items()))
    config_flag(parser, "--grounded-in", "program.grounded_in",
                "with --grounded-hops, where a hop answer must occur: the facts the hop reader cited, or any of the hop's facts")
    config_flag(parser, "--choose-options", "program.choose_options",
                "a final answer that is none of the options the question names (\"..., A or B?\") is asked for again as a choice")
    config_flag(parser, "--compare-by-rule", "program.compare_by_rule",
                "answer comparison and same-country questions from the hop answers by rule (dates, numbers, countries), "
                "the final reader only when a value does not parse")
    config_flag(parser, "--country-names", "program.country_names",
                "with --grounded-hops: a hop answer naming a country its facts name by another word (Austria, Austrian) counts as in them")
    config_flag(parser, "--comparison-plans", "program.comparison_plans",
                "comparison and same-country questions of a shape a rule reads get their sub-questions by rule "
                "(per compared thing, through its director etc., the date or country compared), without the decomposer")
    config_flag(parser, "--hop-passage-facts", "program.hop_passage_facts",
                "the hop reader also reads up to N more facts of the hop's top passage (its other sentences, in order) after the top K")
    config_flag(parser, "--both-by-rule", "program.both_by_rule",
                "with --compare-by-rule: a yes/no question about two things at once (\"Are both A and B ...?\") is answered "
                "from the hops' yes/no answers: no when one said no")
    config_flag(parser, "--documentation-demos", "program.documentation_demos",
                "a question that reads like one about a software manual (settings, commands, flags, versions) is shown "
                "documentation demonstrations in the decomposer instead of the encyclopedia ones")
    config_flag(parser, "--documentation-hop-demos", "program.documentation_hop_demos",
                "with --documentation-demos: the hop reader is shown documentation demonstrations too")
    config_flag(parser, "--bridge-rewrite", "program.bridge_rewrite",
                "how a sub-question's #k become earlier answers: " + "; ".join(f"{k}: {v}" for k, v in BRIDGE_REWRITES.items()))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hyperprove", description="Answer-guided hypergraph expansion for multi-hop QA.")
    commands = parser.add_subparsers(dest="command", required=True)

    index = commands.add_parser("index", help="build a hypergraph index from a corpus, or add passages to one or delete them from it")
    index.add_argument("corpus", nargs="?", help='corpus JSON (a list of {"title", "text"}), or a folder of .txt, .md, .html, .pdf and '
                       'corpus .json/.jsonl files, read recursively and split into passages')
    index.add_argument("--out", help="index directory to write (new, empty, or an earlier index)")
    index.add_argument("--add", metavar="NEW", help="a corpus file of passages to append to the index given by --into, or a folder to bring "
                       "it up to date with: new and changed documents (only the passages whose text changed are extracted and embedded)")
    index.add_argument("--delete", metavar="WHAT", help="a document or folder the index read, or a JSON list of passage ids, titles and "
                       "document paths, to take out of the index given by --into")
    index.add_argument("--into", metavar="DIR", help="the index that --add grows or --delete shrinks, in place and atomically")
    _add_config_flags(index, retriever=False)
    config_flag(index, "--passage-words", "index.passage_words", "a folder's documents: words a passage holds at most (an index keeps the split it was built with)")
    config_flag(index, "--passage-overlap", "index.passage_overlap", "a folder's documents: words repeated where a paragraph is cut")
    config_flag(index, "--follow-links", "index.follow_links", "a folder: read the files and folders its links point to, "
                "wherever they are (a link back into a folder being read is a loop, skipped)")
    config_flag(index, "--max-file-mb", "index.max_file_mb", "a folder: skip a file larger than this, with one line")
    config_flag(index, "--batch-files", "index.batch_files", "a folder: files read, extracted and embedded at a time, each batch "
                "checkpointed in OUT.building/ (a build run again resumes at the first unfinished batch)")
    config_flag(index, "--max-pdf-pages", "index.max_pdf_pages", "a folder: skip a PDF of more pages than this")
    config_flag(index, "--max-pdf-text-mb", "index.max_pdf_text_mb", "a folder: skip a PDF whose pages hold more MB of content to read")
    _add_cluster_flags(index, "LM extraction (lm, lm-entities)")
    index.set_defaults(run=cmd_index)

    ask = commands.add_parser("ask", help="answer one question over an index and show the evidence chain")
    ask.add_argument("index", help="index directory (from `hyperprove index`)")
    ask.add_argument("question")
    ask.add_argument("--profile", action="store_true", help="print what each LM module cost: calls, prompt tokens (and those the server's prompt cache served), generated tokens, seconds")
    ask.add_argument("--html", metavar="FILE", help="also write the evidence chain as a self-contained HTML page")
    _add_config_flags(ask)
    _add_program_flags(ask)
    _add_tracking_flags(ask, "the question's MLflow trace", traces=True)
    ask.set_defaults(run=cmd_ask)

    serve = commands.add_parser("serve", help="answer questions over an index on HTTP (POST /ask, a streaming page at /)")
    serve.add_argument("index", help="index directory (from `hyperprove index`)")
    serve.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1: this machine only)")
    serve.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    serve.add_argument("--allow-remote", action="store_true", help="allow a --host other than loopback (the server has no authentication)")
    _add_config_flags(serve)
    _add_program_flags(serve)
    _add_tracking_flags(serve, "each question's MLflow trace", traces=True)
    serve.set_defaults(run=cmd_serve)

    demo = commands.add_parser("demo", help="index a small shipped corpus with the LM and answer three multi-hop questions")
    _add_config_flags(demo, extractor="lm")
    _add_program_flags(demo)
    demo.add_argument("--write-facts", action="store_true", help="extract the demo corpus afresh with the LM and write experiments/demo/facts.json")
    _add_tracking_flags(demo, "the questions' MLflow traces", traces=True)
    demo.set_defaults(run=cmd_demo, **{"index.extractor": "lm"})  # the demo shows the LM extractor

    evaluate = commands.add_parser("evaluate", help="run retrievers on a question set: Recall@2/@5 (and EM/F1 with an LM), one MLflow run")
    config_flag(evaluate, "--questions", "evaluation.questions",
                "questions JSON (project schema or HippoRAG's); gold passages by id, or as evidence quotes found in the passages")
    config_flag(evaluate, "--corpus", "evaluation.corpus", "corpus JSON the questions refer to, or a folder of documents (read as index reads one)")
    config_flag(evaluate, "--index", "evaluation.index", "index directory built from that corpus", shown="built and cached")
    config_flag(evaluate, "--retriever", "evaluation.retrievers",
                "comma-separated systems, run in one invocation over one index: dense | bm25 | ppr (HippoRAG 2-style) | "
                "proprag (beam search over fact paths) | dense-facts | hypergraphrag (one-shot entity expansion) | "
                "hyperprove-fixed (ablation) | dense-iterative | hyperprove | "
                "hyperprove-passages (the program's top 5 through the same reader)", shown="dense")
    config_flag(evaluate, "--decomposition", "evaluation.decomposition",
                "gold: the datasets' gold sub-questions, retrieval only; lm: hyperprove runs the full program (EM, F1, LM calls)")
    config_flag(evaluate, "--read", "evaluation.read", "with --decomposition lm: every other system's top 5 passages go to the same reader")
    config_flag(evaluate, "--limit", "evaluation.limit", "evaluate the first N questions only (after --skip)")
    config_flag(evaluate, "--skip", "evaluation.skip", "leave out the first N questions (--skip 60 --limit 300: questions 61-360)")
    config_flag(evaluate, "--types", "evaluation.types", "comma-separated question types (the data's `type`): only those, after --skip")
    _add_cluster_flags(evaluate, "the LM systems' questions")
    config_flag(evaluate, "--out", "evaluation.out", "results directory: results.md, results.json, predictions.json, index_manifest.json",
                shown=".hyperprove/results/<name>-<time>")
    _add_tracking_flags(evaluate, "an MLflow run", traces=True)
    _add_config_flags(evaluate)
    _add_program_flags(evaluate)
    evaluate.set_defaults(run=cmd_evaluate)

    sweep = commands.add_parser("sweep", help="Optuna TPE over alpha, theta, L and K; resumable study, MLflow runs per trial")
    config_flag(sweep, "--questions", "evaluation.questions", "questions JSON to optimise on (a train split)")
    config_flag(sweep, "--corpus", "evaluation.corpus", "corpus JSON the questions refer to, or a folder of documents")
    config_flag(sweep, "--decomposition", "evaluation.decomposition", "gold: gold sub-questions; lm: the full program (for F1/EM)")
    config_flag(sweep, "--limit", "evaluation.limit", "the first N questions only (after --skip)")
    config_flag(sweep, "--skip", "evaluation.skip", "leave out the first N questions")
    config_flag(sweep, "--trials", "sweep.trials", "finished trials the study should reach, all workers together; a rerun continues")
    config_flag(sweep, "--objective", "sweep.objective", "maximised")
    config_flag(sweep, "--storage", "sweep.storage", "Optuna storage URL; several workers may share one")
    config_flag(sweep, "--study", "sweep.study", "study name")
    config_flag(sweep, "--seed", "sweep.seed", "TPE seed")
    config_flag(sweep, "--best-out", "sweep.best_out", "experiment config to write with the best parameters")
    config_flag(sweep, "--validate", "sweep.validate", "held-out questions (e.g. dev) to score the best and the configured parameters on afterwards")
    config_flag(sweep, "--transfer-questions", "sweep.transfer_questions",
                "held-out questions over another corpus (with --transfer-corpus): does the best setting carry over?")
    config_flag(sweep, "--transfer-corpus", "sweep.transfer_corpus", "the corpus --transfer-questions refer to")
    config_flag(sweep, "--out", "evaluation.out", "folder for sweep.json (summary, validation) and the plots")
    _add_tracking_flags(sweep, "MLflow runs")
    _add_config_flags(sweep, retriever=False)
    _add_program_flags(sweep)
    sweep.set_defaults(run=calls("optimize.sweep:run_sweep"))

    compile_ = commands.add_parser("compile", help="compile the LM modules with a DSPy optimizer on training questions; writes the program JSON")
    config_flag(compile_, "--questions", "compile.questions",
                "training questions JSON (MuSiQue's and 2Wiki's carry the gold decompositions decompose and rewrite need)")
    config_flag(compile_, "--corpus", "compile.corpus", "corpus JSON the questions refer to, or a folder of documents")
    config_flag(compile_, "--target", "compile.target",
                "decompose, rewrite, or steps (decompose and the hop reader): supervised by gold decompositions; "
                "final: the final reader, shown gold passages' facts (similar); program: every predictor, against answer F1 "
                "(similar: the calls of the questions it answers right, every hop in their gold passages)")
    config_flag(compile_, "--optimizer", "compile.optimizer",
                "bootstrap: BootstrapFewShot; mipro: MIPROv2; gepa: GEPA; similar: --labeled-demos pooled examples "
                "shown to each call, chosen by --choose (no LM, but for --target program)")
    config_flag(compile_, "--skip", "compile.skip", "leave out the first N questions (kept for checking)")
    config_flag(compile_, "--train", "compile.train", "the first N examples to compile on (similar: the first N questions pooled)")
    config_flag(compile_, "--val", "compile.val", "the next N examples, graded before and after (0: none)")
    config_flag(compile_, "--demos", "compile.max_bootstrapped_demos", "bootstrapped demonstrations per predictor")
    config_flag(compile_, "--labeled-demos", "compile.max_labeled_demos",
                "gold examples as demonstrations (decompose, rewrite; similar: per call); 0: the teacher answers with the "
                "program's own demonstrations, and only its graded traces are kept")
    config_flag(compile_, "--choose", "compile.choose",
                "similar, which pooled examples a predictor shows: " + "; ".join(f"{k}: {v.format(n='--labeled-demos')}" for k, v in CHOOSE.items()))
    config_flag(compile_, "--keep-builtin-demos", "compile.keep_builtin", "keep the built-in demonstrations, ahead of the compiled ones",
                shown="the compiled ones replace them", action="store_const", const=True)
    config_flag(compile_, "--threshold", "compile.threshold", "grade a bootstrapped (or, similar, pooled) trace must reach",
                shown="0.6 decompose, 0.8 rewrite, 0.5 program")
    config_flag(compile_, "--auto", "compile.auto", "MIPROv2/GEPA budget")
    config_flag(compile_, "--budget", "compile.budget",
                "instead of --auto, a fixed small budget: GEPA's metric calls, or MIPROv2's candidates and trials")
    config_flag(compile_, "--prompt-lm", "compile.prompt_lm", "LiteLLM id that proposes instructions (MIPROv2) or reflects (GEPA)",
                shown="--lm")
    config_flag(compile_, "--seed", "compile.seed", "optimizer seed")
    config_flag(compile_, "--out", "compile.out", "compiled program JSON to write", shown=".hyperprove/programs/<target>-<optimizer>-<time>.json")
    _add_tracking_flags(compile_, "an MLflow run")
    _add_config_flags(compile_)
    _add_program_flags(compile_)
    compile_.set_defaults(run=calls("optimize.compile:run_compile"))

    reproduce = commands.add_parser("reproduce", help="rerun an evaluate run from its record, replaying its LM calls, and print every metric's change")
    reproduce.add_argument("source", metavar="RUN_ID_OR_FOLDER",
                           help="a results folder (experiments/results/<name>), or an MLflow run id (printed by `hyperprove evaluate`, listed by `hyperprove ui`)")
    _add_tracking_flags(reproduce, "the reproduction as an MLflow run", traces=True)
    config_flag(reproduce, "--cache-dir", TOP_LEVEL, "cache dir to use for what the record does not hold")
    reproduce.add_argument("--live", action="store_true", help="send an LM call the record lacks to the LM instead of stopping")
    reproduce.add_argument("--out", help="results directory of the reproduction")
    reproduce.add_argument("--trust-record", action="store_true",
                           help="also take the record's LM, API endpoint and cache dir (a record names them; by default they are refused or replaced)")
    reproduce.add_argument("--json", action="store_true", help="end with one JSON object")
    reproduce.set_defaults(run=cmd_reproduce)

    pages = commands.add_parser("pages", help="write the evidence-chain pages of a results folder (from its predictions and data files)")
    pages.add_argument("folder", metavar="RESULTS_FOLDER", help="a folder `hyperprove evaluate` wrote")
    pages.add_argument("--out", help="folder to write the pages to (default: RESULTS_FOLDER/pages)")
    pages.add_argument("--json", action="store_true", help="end with one JSON object")
    pages.set_defaults(run=cmd_pages)

    serve_lm = commands.add_parser("serve-lm", help="serve the embedded model on an OpenAI-compatible endpoint for other processes and machines")
    serve_lm.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1: this machine only)")
    serve_lm.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    serve_lm.add_argument("--allow-remote", action="store_true", help="allow a --host other than loopback (the server has no authentication)")
    config_flag(serve_lm, "--slots", "lm.threads", "requests answered side by side (each gets its share of the context)", shown=1,
                metavar="N")
    config_flag(serve_lm, "--pin-prefixes", "lm.pin_prefixes",
                "each request starts from its prefix's saved state, so the same request gets the same answer whatever ran before it")
    _add_config_file(serve_lm, "experiment config file (JSON) whose lm section to use")
    serve_lm.add_argument("--json", action="store_true", help="end with one JSON object")
    serve_lm.set_defaults(run=cmd_serve_lm)

    ui = commands.add_parser("ui", help="the MLflow UI over the project's tracking store (loopback, one worker)")
    ui.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1: this machine only)")
    ui.add_argument("--port", type=int, default=5000)
    ui.add_argument("--allow-remote", action="store_true", help="allow a --host other than loopback (the server has no authentication)")
    _add_tracking_flags(ui)
    _add_config_file(ui, "experiment config file (JSON) whose tracking section to use")
    ui.add_argument("--json", action="store_true", help="end with one JSON object")
    ui.set_defaults(run=cmd_ui)
    return parser


def main(argv: list[str] | None = None, make_runtime: Callable | None = None) -> int:
    """Run one command. `make_runtime(config)` gives the LM and embedder it runs with (default
    `pipeline.runtime.Runtime`: the configured ones); tests pass scripted ones."""
    from pipeline.runtime import Runtime, apply_library_defaults

    apply_library_defaults()
    args = build_parser().parse_args(argv)
    try:
        result = args.run(args, make_runtime or Runtime)
    except (HyperProveError, UnrecordedCall) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: finished work is cached; run the same command again to resume", file=sys.stderr)
        return 130
    except Exception as error:  # an LM provider's failure (bad key, no server, quota) is bad input too
        from dspy.utils.exceptions import LMError

        if not isinstance(error, LMError) and type(error).__module__.split(".")[0] not in LM_ERROR_MODULES:
            raise
        from pipeline.lm.session import LM_UNAVAILABLE

        resume = "; what was answered is in the LM cache, so the same command resumes" if isinstance(error, LM_UNAVAILABLE) else ""
        print(f"error: the LM failed ({type(error).__name__}): {first_line(error, 300)}{resume}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
