"""What an approximate fact search finds at scale: FAISS's IVF kinds on `experiments.bench.large`'s
clustered vectors, by lists, lists scanned and candidates a hit, as recall of the exact top 10
and milliseconds a query (one thread, one query at a time, as a hop searches).

    python -m experiments.bench.ivf --size 3000000 --kinds flat,pq48,pq96,sq8 --probes 16,32,64
    python -m experiments.bench.ivf --size 3000000 --kinds pq48 --lists 4096 --probes 64,128,256 --refines 32

Kinds: `flat` (IVF over the full vectors), `pqM` (IVF-PQ with M bytes a vector), `sq8` (IVF over
8-bit scalar codes). A compressed kind asks for `refine` times 10 candidates and ranks them by the
stored vectors, as `VectorIndex` does (refine 1: the codes' own ranking). `--lists 0` is
`VectorIndex`'s choice for the kind (`lists_for`). The vectors are written once under `--tmp`
and reused by later runs of the same size.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import faiss
import numpy as np

from experiments.bench.large import NOISE, clustered_vectors, exact_top
from experiments.bench.synthetic import DIM
from modules.retrieval.vectors import lists_for

BLOCK = 262_144


def numbers(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def made(kind: str, lists: int) -> tuple[faiss.Index, int]:
    """An untrained IVF index of `kind` over `lists` lists, and how many vectors to train it on."""
    quantiser, wanted = faiss.IndexFlatIP(DIM), lists * 40
    if kind == "flat":
        return faiss.IndexIVFFlat(quantiser, DIM, lists, faiss.METRIC_INNER_PRODUCT), wanted
    if kind.startswith("pq"):
        return faiss.IndexIVFPQ(quantiser, DIM, lists, int(kind[2:]), 8, faiss.METRIC_INNER_PRODUCT), max(wanted, 256 * 40)
    if kind == "sq8":
        return faiss.IndexIVFScalarQuantizer(quantiser, DIM, lists, faiss.ScalarQuantizer.QT_8bit, faiss.METRIC_INNER_PRODUCT), wanted
    raise SystemExit(f"--kinds: {kind!r} is none of flat, pqM, sq8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=3_000_000, help="vectors")
    parser.add_argument("--kinds", default="flat,pq48", help="comma-separated: flat, pqM, sq8")
    parser.add_argument("--lists", type=int, default=0, help="IVF lists (0: VectorIndex's choice for the kind)")
    parser.add_argument("--probes", default="16,32,64", help="lists scanned, comma-separated")
    parser.add_argument("--refines", default="1,8,32", help="candidates a hit wanted, ranked by the vectors (compressed kinds)")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--tmp", default="/tmp", help="where the vectors are written (1.5 GB a million)")
    args = parser.parse_args(argv)
    path = Path(args.tmp) / f"bench-ivf-{args.size}.npy"
    vectors = np.load(path, mmap_mode="r") if path.exists() else clustered_vectors(path, args.size, 1)
    rng = np.random.default_rng(9)
    chosen = np.sort(rng.choice(args.size, size=args.queries, replace=False))
    queries = np.asarray(vectors[chosen]) + NOISE * rng.standard_normal((args.queries, DIM), dtype=np.float32)
    queries = (queries / np.linalg.norm(queries, axis=1, keepdims=True)).astype(np.float32)
    exact = exact_top(vectors, queries, 10)
    for kind in args.kinds.split(","):
        lists = args.lists or lists_for(args.size, "ivf" if kind == "flat" else "ivfpq")
        started = time.perf_counter()
        index, wanted = made(kind, lists)
        index.cp.seed = 0
        index.train(np.ascontiguousarray(vectors[np.sort(np.random.default_rng(0).choice(args.size, size=min(args.size, wanted), replace=False))]))
        for start in range(0, args.size, BLOCK):
            index.add(np.ascontiguousarray(vectors[start:start + BLOCK]))
        build_s = time.perf_counter() - started
        faiss.omp_set_num_threads(1)
        for probes in numbers(args.probes):
            for refine in [1] if kind == "flat" else numbers(args.refines):
                params, found = faiss.SearchParametersIVF(nprobe=probes), []
                started = time.perf_counter()
                for query in queries:
                    _, ids = index.search(query[None], 10 * refine, params=params)
                    candidates = np.sort(ids[0][ids[0] >= 0])
                    found.append(candidates[np.argsort(-(np.asarray(vectors[candidates]) @ query), kind="stable")[:10]] if refine > 1 else ids[0][:10])
                ms = 1000 * (time.perf_counter() - started) / len(queries)
                recall = float(np.mean([len(set(f.tolist()) & set(e.tolist())) / 10 for f, e in zip(found, exact)]))
                print(json.dumps({"size": args.size, "kind": kind, "lists": lists, "probes": probes, "refine": refine,
                                  "recall@10": round(recall, 4), "ms": round(ms, 2), "build_s": round(build_s, 1)}), flush=True)
        faiss.omp_set_num_threads(2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
