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

    def remove(self, rows: np.ndarray) -> None:
        """Take out the vectors at `rows`; the rows after them move up, as in the array the index
        mirrors (FAISS compacts an exact index itself)."""
        rows = np.unique(np.asarray(rows, dtype=np.int64))
        if not len(rows):
            return
        if self.kind == "exact":
            self.index.remove_ids(rows)
            return
        new_ids = np.zeros(len(self), dtype=np.int64)
        new_ids[rows] = -1
        kept = new_ids == 0
        new_ids[kept] = np.arange(kept.sum())
        self.renumber(new_ids)

    def renumber(self, new_ids: np.ndarray) -> None:
        """Keep the vector of each id k with new_ids[k] >= 0, under id new_ids[k] (the kept ones
        are numbered 0..kept-1 in any order). An IVF index keeps the ids it was given, so they are
        renumbered in place, one pass over its lists (not over the vectors); an exact index, whose
        ids are its row order, is filled again in the new order."""
        new_ids = np.asarray(new_ids, dtype=np.int64)
        kept = np.flatnonzero(new_ids >= 0)
        if self.kind == "exact":
            stored = self.index.reconstruct_n(0, self.index.ntotal)
            ordered = np.empty((len(kept), self.index.d), dtype=np.float32)
            ordered[new_ids[kept]] = stored[kept]
            self.index.reset()
            self.index.add(ordered)
            return
        self.index.remove_ids(np.flatnonzero(new_ids < 0))
        lists = self.index.invlists
        for number in range(lists.nlist):
            size = lists.list_size(number)
            if size:
                ids = faiss.rev_swig_ptr(lists.get_ids(number), size)  # a writable view of the list's ids
                ids[:] = new_ids[ids]

    def replace(self, rows: np.ndarray, vectors: np.ndarray) -> None:
        """New vectors for the given rows (ids unchanged): written over an exact index's store;
        removed from an IVF index and added again, under the same ids, to the lists they now fall in."""
        rows = np.asarray(rows, dtype=np.int64)
        matrix = as_float_matrix(vectors)
        if not len(rows):
            return
        if self.kind == "exact":
            stored = faiss.rev_swig_ptr(self.index.get_xb(), self.index.ntotal * self.index.d).reshape(-1, self.index.d)
            stored[rows] = matrix
        else:
            self.index.remove_ids(rows)
            self.index.add_with_ids(matrix, rows)

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
