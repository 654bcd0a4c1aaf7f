"""The `hyperprove` command line: the one room that reaches every folder.

Heavy imports happen inside the commands that need them. Every command takes --json (one JSON
object as the last line of output); bad input exits 2 with a one-line `error: ...` message.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from modules.errors import HyperProveError
from pipeline.config import HyperProveConfig


def _add_config_flags(parser: argparse.ArgumentParser, retriever: bool = True) -> None:
    parser.add_argument("--config", help="experiment config file (JSON); flags override it")
    parser.add_argument("--extractor", choices=["sentences"], help="fact extractor (default: sentences)")
    parser.add_argument("--embedder", help="embedder id (default: all-MiniLM-L6-v2, from its package)")
    parser.add_argument("--eta", type=float, help="synonym cosine threshold (default 0.8)")
    parser.add_argument("--cache-dir", help="embedding and index cache (default .hyperprove/cache)")
    if retriever:
        parser.add_argument("--alpha", type=float, help="weight of cosine against struct (step 9)")
        parser.add_argument("--theta", type=float, help="transition threshold (step 8)")
        parser.add_argument("--depth", type=int, help="L, breadth-first steps (step 8)")
        parser.add_argument("--top-k", type=int, help="K, facts per hop (step 9)")
        parser.add_argument("--seeds", type=int, dest="n_seeds", help="dense seed facts per hop (step 6)")
        parser.add_argument("--subgraph-bound", type=int, help="facts in the local subgraph (step 7)")
    parser.add_argument("--json", action="store_true", help="end with one JSON object")


def _config(args: argparse.Namespace) -> HyperProveConfig:
    base = HyperProveConfig.from_file(args.config) if args.config else HyperProveConfig()
    retriever_flags = {k: getattr(args, k, None) for k in ("alpha", "theta", "depth", "top_k", "n_seeds", "subgraph_bound")}
    index_flags = {"extractor": args.extractor, "embedder": args.embedder, "eta": args.eta}
    return base.with_overrides(retriever=retriever_flags, index=index_flags, cache_dir=args.cache_dir)


def _embedder(config: HyperProveConfig):
    from pipeline.embedder import Embedder

    return Embedder(config.index.embedder, batch_size=config.index.batch_size, cache_dir=config.cache_dir)


def cmd_index(args: argparse.Namespace) -> dict:
    from experiments.data import load_corpus
    from pipeline.index import build_index, save_index

    config = _config(args)
    passages = load_corpus(args.corpus)
    started = time.perf_counter()
    index = build_index(passages, config.index, _embedder(config), progress=True)
    save_index(index, args.out)
    seconds = time.perf_counter() - started
    result = {"index": str(args.out), **index.counts(), "seconds": round(seconds, 2)}
    print(f"index written to {args.out}: {index.counts()} in {seconds:.1f} s")
    return result


def cached_index(passages, config: HyperProveConfig, embedder):
    """The index of this corpus under this config, built once and kept in the cache dir."""
    from pipeline.index import build_index, corpus_checksum, load_index, save_index

    key = f"{corpus_checksum(passages)[:16]}-{config.index.extractor}-{config.index.embedder}-eta{config.index.eta}"
    directory = Path(config.cache_dir) / "indexes" / key.replace("/", "_")
    if (directory / "manifest.json").exists():
        return load_index(directory, expect_embedder=config.index.embedder)
    index = build_index(passages, config.index, embedder, progress=True)
    save_index(index, directory)
    return index


def cmd_evaluate(args: argparse.Namespace) -> dict:
    from experiments.data import load_corpus, load_questions
    from experiments.gold import RETRIEVERS, DensePassageSearch, evaluate_ranker, rank_dense, rank_dense_iterative, rank_hyperprove
    from modules.vectors import VectorIndex
    from pipeline.index import corpus_checksum, load_index

    if args.retriever not in RETRIEVERS:
        raise HyperProveError(f"--retriever {args.retriever!r}: choose one of {', '.join(RETRIEVERS)}")
    config = _config(args)
    passages = load_corpus(args.corpus)
    questions = load_questions(args.questions, passages)
    if args.limit is not None:
        questions = questions[: args.limit]
    embedder = _embedder(config)
    if args.index:
        index = load_index(args.index, expect_embedder=config.index.embedder)
        if index.info["corpus_sha256"] != corpus_checksum(passages):
            raise HyperProveError(f"{args.index}: built from another corpus than {args.corpus}")
    else:
        index = None
    if args.retriever == "hyperprove":
        index = index or cached_index(passages, config, embedder)
        retriever = index.retriever(config.retriever, embedder.encode_query)
        rank = lambda question: rank_hyperprove(question, retriever)  # noqa: E731
    else:
        if index is not None:
            passage_index = index.passage_index
        else:
            vectors = embedder.encode([f"{p.title}\n{p.text}" for p in passages], progress="embed passages")
            passage_index = VectorIndex.build(vectors, exact_max=config.index.exact_search_max)
        search = DensePassageSearch(passage_index, embedder.encode_query)
        ranker = rank_dense if args.retriever == "dense" else rank_dense_iterative
        rank = lambda question: ranker(question, search)  # noqa: E731
    embedder.load()  # now, so that seconds per question measure retrieval only
    summary, _ = evaluate_ranker(questions, rank, progress="evaluate")
    result = {"retriever": args.retriever, **summary}
    if args.retriever != "dense":
        result["decomposition"] = args.decomposition
    if args.retriever == "hyperprove":
        result["config"] = config.retriever.to_dict()
    label = args.retriever if args.retriever == "dense" else f"{args.retriever} ({args.decomposition} decomposition)"
    print(
        f"{label} on {summary['n']} questions: "
        f"Recall@2 {summary['recall@2']:.2f}  Recall@5 {summary['recall@5']:.2f}  "
        f"({1000 * summary['seconds_per_question']:.1f} ms/question)"
    )
    return result


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hyperprove", description="Answer-guided hypergraph expansion for multi-hop QA.")
    commands = parser.add_subparsers(dest="command", required=True)

    index = commands.add_parser("index", help="build a hypergraph index from a corpus")
    index.add_argument("corpus", help='corpus JSON: a list of {"title", "text"}')
    index.add_argument("--out", required=True, help="index directory to write")
    _add_config_flags(index, retriever=False)
    index.set_defaults(run=cmd_index)

    evaluate = commands.add_parser("evaluate", help="Recall@2/@5 of a retriever on a question set")
    evaluate.add_argument("--questions", required=True, help="questions JSON (project schema or HippoRAG's)")
    evaluate.add_argument("--corpus", required=True, help="corpus JSON the questions refer to")
    evaluate.add_argument("--index", help="index directory built from that corpus (default: built and cached)")
    evaluate.add_argument("--retriever", required=True, help="dense | dense-iterative | hyperprove")
    evaluate.add_argument("--decomposition", choices=["gold"], default="gold", help="sub-questions: gold (MuSiQue)")
    evaluate.add_argument("--limit", type=int, help="evaluate the first N questions only")
    _add_config_flags(evaluate)
    evaluate.set_defaults(run=cmd_evaluate)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        result = args.run(args)
    except HyperProveError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: finished work is cached; run the same command again to resume", file=sys.stderr)
        return 130
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
