"""The retriever out of core at 1M, 3M and 10M facts: a synthetic index built, saved, loaded and
searched as the command line would, with its memory, its load time, its hop latency and the
recall of its seed search against exact search.

    python -m experiments.bench.large [--sizes 1000000,3000000,10000000] [--queries 50] [--tmp DIR] [--json]

The corpus is `experiments.bench.synthetic`'s (skewed entities over N/5 names, passages of 1-7
facts), but its fact vectors have neighbours, as text embeddings do: each is a random centre of
N/200 plus noise (cosine about 0.8 to its centre, 0.64 to a neighbour), written to disk a block at
a time, so no array of all of them is ever in memory. A query is a fact's vector with as much
noise again. Per size, two processes on one index folder:
- build: `assemble_index` (synonym search, FAISS indexes: IVF-PQ above `compressed_search_min`,
  2M vectors) and `save_index`; seconds, peak memory, the index's size on disk;
- search: `load_index` (facts and passages read as the columns the save left in `derived/`, fact
  and passage vectors memory-mapped where IVF-PQ searches them, their rows read by queries from
  8-bit codes mapped beside them and read into the page cache in the background), the first hop
  (which builds the hypergraph's matrices), then two hops per query (`HypergraphRetriever`, no
  BM25: the texts are stand-ins) at once and again once the codes are read in, and the seed
  search's recall@n_seeds against exact search (a scan of every stored vector, in blocks).
Memory is sampled every 0.2 s from /proc/self/status: the peak of anonymous memory (what the
process needs) beside the peak resident set (VmHWM, which also counts pages of memory-mapped
files the kernel keeps while it has room; it drops them again under pressure).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from experiments.bench.synthetic import DIM, unit_vectors

ROOT = Path(__file__).resolve().parents[2]
NOISE = 0.038  # per dimension: |noise| = 0.038 * sqrt(384) = 0.745, so cos(vector, centre) = 0.8


class MemoryPeaks:
    """Peaks of RssAnon and VmHWM (GiB) of this process, sampled on a thread until `stop`."""

    def __init__(self, every: float = 0.2):
        self.anon = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, args=(every,), daemon=True)
        self._thread.start()

    @staticmethod
    def status() -> dict[str, float]:
        fields = {}
        for line in Path("/proc/self/status").read_text().splitlines():
            name, _, value = line.partition(":")
            if name in ("RssAnon", "VmHWM"):
                fields[name] = int(value.split()[0]) / 2**20  # kB -> GiB
        return fields

    def _sample(self, every: float) -> None:
        while not self._stop.wait(every):
            self.anon = max(self.anon, self.status().get("RssAnon", 0.0))

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join()
        now = self.status()
        return {"peak_anon_gib": round(max(self.anon, now.get("RssAnon", 0.0)), 2), "peak_rss_gib": round(now.get("VmHWM", 0.0), 2)}


def clustered_vectors(path: Path, n: int, seed: int, block: int = 200_000) -> np.ndarray:
    """`n` unit vectors near N/200 random centres, written to a .npy at `path` a block at a time;
    returned memory-mapped."""
    rng = np.random.default_rng(seed)
    centres = unit_vectors(rng, max(n // 200, 16))
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(n, DIM))
    for start in range(0, n, block):
        rows = centres[rng.integers(0, len(centres), size=min(block, n - start))]
        rows = rows + NOISE * rng.standard_normal(rows.shape, dtype=np.float32)
        out[start:start + len(rows)] = rows / np.linalg.norm(rows, axis=1, keepdims=True)
        out.flush()
    del out
    return np.load(path, mmap_mode="r")


def build(folder: Path, n_facts: int, compressed_min: int) -> dict:
    from modules.facts import Passage
    from modules.retrieval.hypergraph import binary_csr
    from pipeline.config import IndexConfig
    from pipeline.index.build import assemble_index, corpus_checksum
    from pipeline.index.store import save_index

    peaks = MemoryPeaks()
    rng = np.random.default_rng(0)
    n_entities = max(n_facts // 5, 10)
    per_fact = rng.integers(1, 5, size=n_facts)
    weights = 1.0 / (np.arange(n_entities) + 20.0)
    incidence = binary_csr(np.repeat(np.arange(n_facts), per_fact), rng.choice(n_entities, size=int(per_fact.sum()), p=weights / weights.sum()),
                           (n_facts, n_entities))
    passage_of = np.repeat(np.arange(n_facts), rng.integers(1, 8, size=n_facts))[:n_facts]
    n_passages = int(passage_of[-1]) + 1
    scratch = folder.with_name(folder.name + ".vectors")
    scratch.mkdir(exist_ok=True)
    started = time.perf_counter()
    vectors = {"fact": clustered_vectors(scratch / "fact.npy", n_facts, 1), "entity": unit_vectors(rng, n_entities),
               "passage": clustered_vectors(scratch / "passage.npy", n_passages, 2)}
    made_s = time.perf_counter() - started
    config = IndexConfig(compressed_search_min=compressed_min)
    passages = [Passage(f"p{k}", f"p{k}") for k in range(n_passages)]
    info = {"extractor": {"name": "synthetic", "version": "1"}, "embedder": {"id": "random", "dim": DIM}, "config": asdict(config),
            "corpus_sha256": corpus_checksum(passages), "generations": [{"generation": 0, "added": n_passages, "facts": n_facts}], "next_passage_id": n_passages}
    names = [f"e{k}" for k in range(n_entities)]
    started = time.perf_counter()
    index = assemble_index(passages, [f"f{k}" for k in range(n_facts)], passage_of, incidence, names, vectors, config, info, entity_keys=names)
    build_s = time.perf_counter() - started
    started = time.perf_counter()
    save_index(index, folder)
    save_s = time.perf_counter() - started
    size = sum(path.stat().st_size for path in folder.iterdir()) / 2**30
    return {"facts": n_facts, "entities": n_entities, "passages": n_passages, "vectors_s": round(made_s, 1), "build_s": round(build_s, 1),
            "save_s": round(save_s, 1), "index_gib": round(size, 2),
            "search_kinds": {name: getattr(index, f"{name}_index").kind for name in ("fact", "entity", "passage")}, **peaks.stop()}


def search(folder: Path, n_queries: int) -> dict:
    from modules.retrieval.retriever import RetrieverConfig
    from pipeline.index.store import load_index

    peaks = MemoryPeaks()
    started = time.perf_counter()
    index = load_index(folder)
    loaded = time.perf_counter()
    load_s = loaded - started
    config = RetrieverConfig(lexical_seeds=0, lexical_weight=0.0)
    rng = np.random.default_rng(9)
    chosen = rng.choice(len(index.fact_text), size=2 * n_queries, replace=False)  # half for each round of hops
    queries = np.asarray(index.fact_vectors[np.sort(chosen)]) + NOISE * rng.standard_normal((2 * n_queries, DIM), dtype=np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    lookup = {f"q{k}": queries[k] for k in range(2 * n_queries)}
    started = time.perf_counter()
    retriever = index.retriever(config, lookup.__getitem__)
    retriever("q0")  # the first hop also builds the hypergraph's matrices
    first_hop_s = time.perf_counter() - started
    early_ms = hop_times(retriever, range(n_queries))  # while the load's background read of the codes may still run
    if index.reading is not None:
        index.reading.join()
    read_in_s = time.perf_counter() - loaded
    hop_ms = hop_times(retriever, range(n_queries, 2 * n_queries))
    _, found = index.fact_index.search(queries, config.n_seeds)
    exact = exact_top(index.fact_vectors, queries, config.n_seeds)
    recall = float(np.mean([len(set(f) & set(e)) / len(e) for f, e in zip(found.tolist(), exact.tolist())]))
    return {"load_s": round(load_s, 1), "first_hop_s": round(first_hop_s, 2), "codes_read_in_s": round(read_in_s, 1),
            "early_hop_ms_p95": round(float(np.percentile(early_ms, 95)), 2),
            "hop_ms_p50": round(float(np.median(hop_ms)), 2), "hop_ms_p95": round(float(np.percentile(hop_ms, 95)), 2),
            "seed_recall": round(recall, 4), "n_seeds": config.n_seeds, "queries": n_queries, **{f"search_{k}": v for k, v in peaks.stop().items()}}


def hop_times(retriever, queries: range) -> list[float]:
    """Milliseconds of each hop of two per query: a seed hop, then one from its frontier."""
    times = []
    for position, k in enumerate(queries):
        t0 = time.perf_counter()
        first = retriever(f"q{k}")
        t1 = time.perf_counter()
        retriever(f"q{queries[(position + 1) % len(queries)]}", frontier=first.frontier)
        times += [1000 * (t1 - t0), 1000 * (time.perf_counter() - t1)]
    return times


def exact_top(vectors: np.ndarray, queries: np.ndarray, k: int, block: int = 262_144) -> np.ndarray:
    """The ids of each query's k highest inner products over every stored vector, a block at a time."""
    best_scores = np.full((len(queries), k), -np.inf, dtype=np.float32)
    best_ids = np.zeros((len(queries), k), dtype=np.int64)
    for start in range(0, len(vectors), block):
        scores = queries @ np.asarray(vectors[start:start + block]).T
        scores = np.concatenate([best_scores, scores], axis=1)
        ids = np.concatenate([best_ids, np.broadcast_to(np.arange(start, start + scores.shape[1] - k), (len(queries), scores.shape[1] - k))], axis=1)
        top = np.argpartition(-scores, k - 1, axis=1)[:, :k]
        best_scores, best_ids = np.take_along_axis(scores, top, axis=1), np.take_along_axis(ids, top, axis=1)
    return best_ids


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000000,3000000,10000000", help="comma-separated fact counts")
    parser.add_argument("--queries", type=int, default=50, help="queries per size and round (two hops each)")
    parser.add_argument("--tmp", help="where the index folders go (default: the system's temporary folder); 10M facts take about 40 GB (vectors and the index)")
    parser.add_argument("--compressed-min", type=int, default=2_000_000, help="index.compressed_search_min: IVF-PQ above this many vectors")
    parser.add_argument("--json", action="store_true", help="end with one JSON object")
    parser.add_argument("--phase", choices=("build", "search"), help=argparse.SUPPRESS)  # internal: one phase in this process
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.phase:
        folder, size = Path(args.folder), int(args.sizes)
        print(json.dumps(build(folder, size, args.compressed_min) if args.phase == "build" else search(folder, args.queries)))
        return 0
    results = []
    for size in [int(s) for s in args.sizes.split(",") if s.strip()]:
        with tempfile.TemporaryDirectory(dir=args.tmp) as scratch:
            row = {}
            for phase in ("build", "search"):
                command = [sys.executable, "-m", __spec__.name, "--phase", phase, "--folder", str(Path(scratch) / "index"),
                           "--sizes", str(size), "--queries", str(args.queries), "--compressed-min", str(args.compressed_min)]
                done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
                if done.returncode != 0:
                    print(f"error: {size:,} facts, {phase}: {done.stderr.strip().splitlines()[-3:]}", file=sys.stderr)
                    return 1
                row.update(json.loads(done.stdout.strip().splitlines()[-1]))
        results.append(row)
        print(f"{row['facts']:>11,} facts: build {row['build_s']} s (+ vectors {row['vectors_s']} s, save {row['save_s']} s), "
              f"peak {row['peak_anon_gib']} GiB anonymous / {row['peak_rss_gib']} GiB resident, {row['index_gib']} GiB on disk; "
              f"load {row['load_s']} s, first hop {row['first_hop_s']} s (hop p95 {row['early_hop_ms_p95']} ms until the codes were read in, "
              f"{row['codes_read_in_s']} s after the load), peak {row['search_peak_anon_gib']} / {row['search_peak_rss_gib']} GiB; "
              f"hop p50 {row['hop_ms_p50']} ms, p95 {row['hop_ms_p95']} ms; seed recall@{row['n_seeds']} {row['seed_recall']:.3f}; "
              f"{row['search_kinds']}", flush=True)
    if args.json:
        print(json.dumps({"sizes": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
