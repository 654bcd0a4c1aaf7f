"""Inner-product search over unit vectors with FAISS: exact for small sets, IVF for large ones.

Why IVF and not HNSW above the threshold: on 2 cores an HNSW graph over a million 384-d
vectors takes minutes to build, while an inverted-file index (k-means on a sample, one
assignment pass) builds in seconds and answers a single query in about a millisecond when
`nprobe` lists are scanned. Small corpora (every benchmark here) stay exact.
"""

from __future__ import annotations

import faiss
import numpy as np

EXACT_MAX = 50_000  # up to this many vectors the search is exact (IndexFlatIP)
IVF_NPROBE = 16
_TRAIN_PER_LIST = 40  # FAISS wants >= 39 training points per centroid


def as_float_matrix(vectors: np.ndarray) -> np.ndarray:
    """C-contiguous float32 rows, the layout FAISS reads without copying."""
    matrix = np.asarray(vectors, dtype=np.float32)
    if matrix.ndim == 1:
        matrix = matrix[None, :]
    return np.ascontiguousarray(matrix)


class VectorIndex:
    """A FAISS inner-product index; cosine search when the stored vectors are unit length."""

    def __init__(self, index: faiss.Index):
        self.index = index

    @classmethod
    def build(cls, vectors: np.ndarray, exact_max: int = EXACT_MAX, seed: int = 0) -> "VectorIndex":
        matrix = as_float_matrix(vectors)
        n, dim = matrix.shape
        if n <= exact_max:
            index = faiss.IndexFlatIP(dim)
        else:
            n_lists = int(np.clip(np.sqrt(n), 64, 1024))
            index = faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, n_lists, faiss.METRIC_INNER_PRODUCT)
            rng = np.random.default_rng(seed)
            sample = matrix[np.sort(rng.choice(n, size=min(n, n_lists * _TRAIN_PER_LIST), replace=False))]
            index.cp.seed = seed
            index.train(sample)
            index.nprobe = IVF_NPROBE
        index.add(matrix)
        return cls(index)

    @property
    def kind(self) -> str:
        return "exact" if isinstance(self.index, faiss.IndexFlat) else "ivf"

    def __len__(self) -> int:
        return self.index.ntotal

    def search(self, queries: np.ndarray, k: int, nprobe: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Top-k (scores, ids) per query row; ids of -1 (fewer than k stored) are dropped by callers.

        A single query runs on one OpenMP thread: two threads were twice as slow per query here.
        `nprobe` overrides the number of IVF lists scanned (ignored by exact search).
        """
        matrix = as_float_matrix(queries)
        k = max(1, min(k, len(self)))
        threads = faiss.omp_get_max_threads()
        if len(matrix) == 1:
            faiss.omp_set_num_threads(1)
        try:
            if nprobe is not None and self.kind == "ivf":
                scores, ids = self.index.search(matrix, k, params=faiss.SearchParametersIVF(nprobe=nprobe))
            else:
                scores, ids = self.index.search(matrix, k)
        finally:
            faiss.omp_set_num_threads(threads)
        return scores, ids

    def within(self, queries: np.ndarray, threshold: float, nprobe: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Every stored vector whose inner product with a query exceeds `threshold`, as (query row,
        id) pairs: a range search, for when the number of near neighbours is not known in advance."""
        matrix = as_float_matrix(queries)
        if self.kind == "ivf":
            params = faiss.SearchParametersIVF(nprobe=nprobe or IVF_NPROBE)
            limits, _, ids = self.index.range_search(matrix, float(threshold), params=params)
        else:
            limits, _, ids = self.index.range_search(matrix, float(threshold))
        rows = np.repeat(np.arange(len(matrix)), np.diff(limits.astype(np.int64)))
        return rows, ids.astype(np.int64)
