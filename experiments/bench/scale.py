"""Scale benchmark: build time, peak memory and per-hop latency at 10k / 100k / 1M facts.

Synthetic corpus: random unit vectors stand in for text embeddings (384-d, as MiniLM); each fact
has 1-4 entities drawn from a skewed (Zipf-like, p ~ 1/(rank + 20)) distribution over N/5
entities, so the largest entities are hubs in 10k+ facts at 1M facts; facts sit in passages of
1-7 facts. The build is the real one (synonym search over entity vectors, FAISS fact index,
the hypergraph factors); embedding is excluded, since the vectors are given.

Per hop: `HypergraphRetriever` on a query vector (seed search included, query embedding
excluded), hop 1 with an empty frontier and hop 2 carrying hop 1's frontier. Beside it, in the
same process and over the same graph, one global Personalized PageRank query as HippoRAG runs
it: power iteration (scipy.sparse, damping 0.5, to an L1 change below 1e-6) over the
fact-entity-passage graph, personalised on the same dense seeds.

Each size runs in its own process, so peak RSS is that size's own.

    python -m experiments.bench.scale [--sizes 10000,100000,1000000] [--queries 50] [--json]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from experiments.bench.synthetic import synthetic_corpus, unit_vectors
from modules.facts import Passage
from modules.retrieval.hypergraph import Hypergraph, expand_synonyms


def ppr_matrix(incidence: sp.csr_matrix, passage_of: np.ndarray, n_passages: int) -> sp.csr_matrix:
    """Column-stochastic transitions of the undirected fact-entity-passage graph."""
    from experiments.baselines import column_stochastic

    n_facts, n_entities = incidence.shape
    fact_passage = sp.csr_matrix((np.ones(n_facts), (np.arange(n_facts), passage_of)), shape=(n_facts, n_passages))
    return column_stochastic(sp.bmat([
        [None, incidence, fact_passage],
        [incidence.T, None, None],
        [fact_passage.T, None, None],
    ], format="csr"))


def run_size(n_facts: int, n_queries: int, ppr_queries: int) -> dict:
    from modules.retrieval.retriever import FactTable, HypergraphRetriever, RetrieverConfig
    from modules.retrieval.vectors import VectorIndex
    from pipeline.config import IndexConfig
    from pipeline.index.build import synonym_matrix

    incidence, passage_of, n_passages, fact_vectors, entity_vectors = synthetic_corpus(n_facts)
    config = IndexConfig()

    started = time.perf_counter()
    synonyms, _ = synonym_matrix(entity_vectors, config.eta, config.synonym_neighbors, config.exact_search_max)
    fact_index = VectorIndex.build(fact_vectors, exact_max=config.exact_search_max)
    hypergraph = Hypergraph(expand_synonyms(incidence, synonyms), passage_of, n_passages)
    build_s = time.perf_counter() - started

    rng = np.random.default_rng(1)
    queries = unit_vectors(rng, n_queries)
    lookup = {f"q{k}": queries[k] for k in range(n_queries)}
    table = FactTable(text=_FactNames(), passage=passage_of, passages=_PassageNames(), vectors=fact_vectors, index=fact_index)
    # synthetic facts are vectors without words, so no BM25: the dense hop is what is timed
    retriever = HypergraphRetriever(hypergraph, table, lookup.__getitem__, RetrieverConfig(lexical_seeds=0, lexical_weight=0.0))
    retriever("q0")  # warm-up
    hop_ms, seeds_of = [], []
    for k in range(n_queries):
        t0 = time.perf_counter()
        first = retriever(f"q{k}")
        t1 = time.perf_counter()
        retriever(f"q{(k + 1) % n_queries}", frontier=first.frontier)
        t2 = time.perf_counter()
        hop_ms += [1000 * (t1 - t0), 1000 * (t2 - t1)]
        seeds_of.append(first.trace["dense_seeds"])

    from experiments.baselines import dangling_nodes, personalized_pagerank

    transitions = ppr_matrix(hypergraph.B_he, passage_of, n_passages)
    dangling = dangling_nodes(transitions)
    ppr_ms = []
    for seeds in seeds_of[:ppr_queries]:
        t0 = time.perf_counter()
        reset = np.zeros(transitions.shape[0])
        reset[seeds] = 1.0
        personalized_pagerank(transitions, reset, dangling=dangling)
        ppr_ms.append(1000 * (time.perf_counter() - t0))

    degrees = np.asarray(incidence.sum(axis=0)).ravel()
    return {
        "facts": n_facts,
        "entities": int(incidence.shape[1]),
        "passages": n_passages,
        "largest_entity_degree": int(degrees.max()),
        "entities_in_10k_plus_facts": int((degrees >= 10_000).sum()),
        "fact_search": fact_index.kind,
        "build_s": round(build_s, 2),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "hop_ms_median": round(float(np.median(hop_ms)), 3),
        "hop_ms_p95": round(float(np.percentile(hop_ms, 95)), 3),
        "ppr_ms_median": round(float(np.median(ppr_ms)), 3),
        "hops_timed": len(hop_ms),
        "ppr_queries_timed": len(ppr_ms),
    }


class _FactNames:
    """Stand-in fact texts ("f<id>") without a million-string list."""

    def __getitem__(self, k: int) -> str:
        return f"f{k}"


class _PassageNames:
    """Stand-in passages ("p<id>") without a list of a million."""

    def __getitem__(self, k: int):
        return Passage(f"p{k}", f"p{k}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="10000,100000,1000000", help="comma-separated fact counts")
    parser.add_argument("--queries", type=int, default=50, help="queries per size (two hops each)")
    parser.add_argument("--ppr-queries", type=int, default=10, help="PPR queries per size")
    parser.add_argument("--json", action="store_true", help="end with one JSON object")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # internal: run one size in this process
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(run_size(args.one, args.queries, args.ppr_queries)))
        return 0
    results = []
    for size in [int(s) for s in args.sizes.split(",") if s.strip()]:
        command = [sys.executable, "-m", __spec__.name, "--one", str(size), "--queries", str(args.queries), "--ppr-queries", str(args.ppr_queries)]
        finished = subprocess.run(command, capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2])
        if finished.returncode != 0:
            print(f"error: size {size} failed: {finished.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
            return 1
        row = json.loads(finished.stdout.strip().splitlines()[-1])
        results.append(row)
        print(
            f"{row['facts']:>9,} facts: build {row['build_s']:7.2f} s  peak RSS {row['peak_rss_mb']:8.1f} MB  "
            f"hop median {row['hop_ms_median']:6.2f} ms  p95 {row['hop_ms_p95']:6.2f} ms  "
            f"PPR median {row['ppr_ms_median']:8.2f} ms  ({row['ppr_ms_median'] / row['hop_ms_median']:.0f}x)  "
            f"hub degree {row['largest_entity_degree']:,}",
            flush=True,
        )
    if args.json:
        print(json.dumps({"sizes": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
