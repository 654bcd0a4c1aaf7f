"""Inner-product search over unit vectors with FAISS: exact for small sets, IVF for large ones,
IVF over product-quantised codes (IVF-PQ) for the largest.

Why IVF and not HNSW above the threshold: on 2 cores an HNSW graph over a million 384-d
vectors takes minutes to build, while an inverted-file index (k-means on a sample, one
assignment pass) builds in seconds and answers a single query in about a millisecond when
`nprobe` lists are scanned. Small corpora (every benchmark here) stay exact.

Why IVF-PQ for the largest: an IVF index holds every vector again beside the array it mirrors
(1.5 KB a 384-d vector: 15 GB at 10 million facts); PQ codes hold dim / 8 bytes a vector (48).
Codes rank approximately, so a search asks them for REFINE times the hits wanted and ranks
those again by the stored vectors (`rows`, which may be a memory-mapped array: only the rows
asked for are read, or their `CodedRows`). With 32 candidates a hit, the codes lose nothing the
lists find: at 3M clustered vectors IVF-PQ finds what IVF over the full vectors finds, at every
nprobe. What is lost is lost to the lists, so IVF-PQ gets finer ones (2 sqrt(N), to 8192) and
scans more of them (256). On `experiments.bench.large`'s vectors (recall of the exact top 10):
at 3M, 1024 lists and 16 probes found 0.761, 4096 lists and 64 probes 0.987 (1.6 ms a query);
at 10M, 6324 lists and 64, 128, 256 probes found 0.844, 0.874, 0.924. Codes are 32 times
smaller than vectors, so the wider scan stays cheap; the cost is k-means over more lists.
"""

from __future__ import annotations

from typing import Callable

import faiss
import numpy as np

EXACT_MAX = 50_000  # up to this many vectors the search is exact (IndexFlatIP)
COMPRESSED_MIN = 2_000_000  # above this many, IVF-PQ
NPROBE = {"ivf": 16, "ivfpq": 256}  # lists a search scans: given at search time, whatever a saved index holds
IVFPQ_MAX_LISTS = 8192
REFINE = 32  # IVF-PQ: candidates asked of the codes per hit wanted, ranked again exactly
_TRAIN_PER_LIST = 40  # FAISS wants >= 39 training points per centroid
_PQ_TRAIN = 256 * 40  # and as many per code of a sub-quantiser (8 bits: 256 codes)
PQ_MIN = 1024  # fewer vectors than this are never compressed


def as_float_matrix(vectors: np.ndarray) -> np.ndarray:
    """C-contiguous float32 rows, the layout FAISS reads without copying."""
    matrix = np.asarray(vectors, dtype=np.float32)
    if matrix.ndim == 1:
        matrix = matrix[None, :]
    return np.ascontiguousarray(matrix)


class VectorIndex:
    """A FAISS inner-product index; cosine search when the stored vectors are unit length.

    Vectors added to an IVF index after it was built go to a second IVF index on the same
    centroids (`added`), under their own ids, until the retrain rule builds the whole index again.
    Adding them to the trained lists would copy each list whole as it takes its first new vector
    (FAISS reads lists from disk at their exact size, and a growing list doubles its room): on a
    million facts that is seconds and a second copy of the vectors for ten thousand new ones. The
    two are searched together; with the same centroids they scan the same lists, so they answer
    as one index holding every vector would.
    """

    def __init__(self, index: faiss.Index | None, added: faiss.Index | None = None, rows: np.ndarray | CodedRows | None = None,
                 load: Callable[[], tuple[faiss.Index, faiss.Index | None]] | None = None):
        """`rows`: the vectors the index was given, row for row (or their `CodedRows`), which an
        IVF-PQ search ranks its candidates by (`HypergraphIndex` hands them over). `load`, with no
        `index`: what gives the index and its added part on first use (a saved set that queries
        never search, such as the entity names at 10M facts, 3 GB, is then read only by updates)."""
        self.rows = rows
        self._load = load
        if index is not None:
            self._set(index, added)

    def _set(self, index: faiss.Index, added: faiss.Index | None) -> None:
        if added is not None and not _same_lists(index, added):
            raise ValueError("the added vectors' index is not an IVF index on the same centroids")
        self._index, self._added = index, added

    def _read(self) -> "VectorIndex":
        """Itself, its deferred index read first."""
        if self._load is not None:
            self._set(*self._load())
            self._load = None
        return self

    @property
    def deferred(self) -> bool:
        return self._load is not None

    @property
    def index(self) -> faiss.Index:
        return self._read()._index

    @property
    def added(self) -> faiss.Index | None:
        return self._read()._added

    @added.setter
    def added(self, added: faiss.Index | None) -> None:
        self._added = added

    @staticmethod
    def kind_for(n: int, exact_max: int = EXACT_MAX, compressed_min: int = COMPRESSED_MIN) -> str:
        """exact up to `exact_max` vectors, IVF-PQ above `compressed_min` (and above PQ_MIN,
        which training its 256 codes a sub-quantiser needs), IVF between."""
        return "exact" if n <= exact_max else "ivfpq" if n > max(compressed_min, PQ_MIN) else "ivf"

    @classmethod
    def build(cls, vectors: np.ndarray, exact_max: int = EXACT_MAX, seed: int = 0, compressed_min: int = COMPRESSED_MIN,
              block: int = 262_144) -> "VectorIndex":
        """The index `kind_for` the number of vectors, filled `block` rows at a time (a
        memory-mapped array is read once, never copied whole)."""
        n, dim = vectors.shape
        kind = cls.kind_for(n, exact_max, compressed_min)
        if kind == "exact":
            index = faiss.IndexFlatIP(dim)
        else:
            n_lists = lists_for(n, kind)
            if kind == "ivf":
                index, wanted = faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, n_lists, faiss.METRIC_INNER_PRODUCT), n_lists * _TRAIN_PER_LIST
            else:
                index = faiss.IndexIVFPQ(faiss.IndexFlatIP(dim), dim, n_lists, sub_quantisers(dim), 8, faiss.METRIC_INNER_PRODUCT)
                wanted = max(n_lists * _TRAIN_PER_LIST, _PQ_TRAIN)
            rng = np.random.default_rng(seed)
            index.cp.seed = seed
            index.train(as_float_matrix(vectors[np.sort(rng.choice(n, size=min(n, wanted), replace=False))]))
            index.nprobe = NPROBE[kind]
        for start in range(0, n, block):
            index.add(as_float_matrix(vectors[start:start + block]))
        return cls(index, rows=vectors)

    @property
    def kind(self) -> str:
        if isinstance(self.index, faiss.IndexFlat):
            return "exact"
        return "ivfpq" if isinstance(faiss.downcast_index(self.index), faiss.IndexIVFPQ) else "ivf"

    @property
    def parts(self) -> list[faiss.Index]:
        """The FAISS indexes searched: the built one, then the one of vectors added since."""
        return [self.index] if self.added is None else [self.index, self.added]

    def __len__(self) -> int:
        return sum(part.ntotal for part in self.parts)

    def add(self, vectors: np.ndarray) -> None:
        """Append rows len(self)...: to an exact index itself, to an IVF index's `added` part."""
        matrix = as_float_matrix(vectors)
        if not len(matrix):
            return
        if self.kind == "exact":
            self.index.add(matrix)
        else:
            self._added_part().add_with_ids(matrix, np.arange(len(self), len(self) + len(matrix), dtype=np.int64))

    def _added_part(self) -> faiss.Index:
        if self.added is None:
            if self.kind == "ivfpq":  # the same centroids and codebooks, no codes yet
                self.added = faiss.clone_index(self.index)
                self.added.reset()
            else:
                self.added = faiss.IndexIVFFlat(faiss.clone_index(self.index.quantizer), self.index.d, self.index.nlist,
                                                faiss.METRIC_INNER_PRODUCT)
            self.added.nprobe = self.index.nprobe
        return self.added

    def search(self, queries: np.ndarray, k: int, nprobe: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Top-k (scores, ids) per query row; ids of -1 (fewer than k stored) are dropped by callers.

        A single query runs on one OpenMP thread: two threads were twice as slow per query here.
        `nprobe`: the number of IVF lists scanned (default NPROBE of the kind; ignored by exact search).
        """
        matrix = as_float_matrix(queries)
        k = max(1, min(k, len(self)))
        refined = self.kind == "ivfpq" and self.rows is not None
        asked = min(k * REFINE, len(self)) if refined else k
        params = self._scanned(nprobe)
        threads = faiss.omp_get_max_threads()
        if len(matrix) == 1:
            faiss.omp_set_num_threads(1)
        try:
            found = [part.search(matrix, asked, params=params) for part in self.parts]
        finally:
            faiss.omp_set_num_threads(threads)
        scores, ids = (np.concatenate(columns, axis=1) for columns in zip(*found))
        if refined:  # the codes' candidates, scored by their stored vectors (read in row order)
            scores = np.full(ids.shape, -np.inf, dtype=np.float32)
            for row, query in enumerate(matrix):
                candidates = np.sort(ids[row][ids[row] >= 0])
                ids[row] = -1
                ids[row, :len(candidates)] = candidates
                scores[row, :len(candidates)] = as_float_matrix(self.rows[candidates]) @ query
        if len(found) == 1 and not refined:
            return scores, ids
        best = np.argsort(-scores, axis=1, kind="stable")[:, :k]
        scores, ids = np.take_along_axis(scores, best, axis=1), np.take_along_axis(ids, best, axis=1)
        ids[~np.isfinite(scores)] = -1
        return scores, ids

    def _scanned(self, nprobe: int | None) -> faiss.SearchParametersIVF | None:
        """The lists a search scans: `nprobe`, else NPROBE of this kind (None: exact search)."""
        kind = self.kind
        return None if kind == "exact" else faiss.SearchParametersIVF(nprobe=nprobe or NPROBE[kind])

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
        dropped = np.flatnonzero(new_ids < 0)
        for part in self.parts:
            part.remove_ids(dropped)
            lists = part.invlists
            for number in range(lists.nlist):
                size = lists.list_size(number)
                if size:
                    ids = faiss.rev_swig_ptr(lists.get_ids(number), size)  # a writable view of the list's ids
                    ids[:] = new_ids[ids]

    def replace(self, rows: np.ndarray, vectors: np.ndarray) -> None:
        """New vectors for the given rows (ids unchanged): written over an exact index's store;
        taken out of an IVF index and added again, under the same ids, to its `added` part."""
        rows = np.asarray(rows, dtype=np.int64)
        matrix = as_float_matrix(vectors)
        if not len(rows):
            return
        if self.kind == "exact":
            stored = faiss.rev_swig_ptr(self.index.get_xb(), self.index.ntotal * self.index.d).reshape(-1, self.index.d)
            stored[rows] = matrix
        else:
            for part in self.parts:
                part.remove_ids(rows)
            self._added_part().add_with_ids(matrix, rows)

    def within(self, queries: np.ndarray, threshold: float, nprobe: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every stored vector whose inner product with a query exceeds `threshold`, as (query row,
        id, score) triples ordered by query row: a range search, for when the number of near
        neighbours is not known in advance."""
        matrix = as_float_matrix(queries)
        params = self._scanned(nprobe)
        rows, ids, scores = [], [], []
        for part in self.parts:
            limits, part_scores, part_ids = part.range_search(matrix, float(threshold), params=params)
            rows.append(np.repeat(np.arange(len(matrix)), np.diff(limits.astype(np.int64))))
            ids.append(part_ids.astype(np.int64))
            scores.append(part_scores)
        rows, ids, scores = np.concatenate(rows), np.concatenate(ids), np.concatenate(scores)
        order = np.argsort(rows, kind="stable")
        return rows[order], ids[order], scores[order]


class CodedRows:
    """A vector set's rows as 8-bit codes (FAISS's scalar quantiser, a range a dimension: a
    quarter of float32), decoded as they are asked for. Why: a row of a memory-mapped array is
    a page read from disk once the array outgrows the page cache; at 10M facts the 320
    candidates of one IVF-PQ search, read from the mapping, took most of a 300 ms hop. Codes
    stay in memory (3.8 GB at 10M 384-d facts); a cosine from them is within about 1e-3 of the
    exact one. Filled a block of rows at a time (`put`), so the float rows are never all in
    memory."""

    def __init__(self, quantiser: faiss.ScalarQuantizer, codes: np.ndarray):
        self.quantiser = quantiser
        self.codes = codes

    @classmethod
    def trained(cls, sample: np.ndarray, n: int) -> "CodedRows":
        """Codes for `n` rows, each dimension's range taken from `sample` (rows spread over the
        set) and widened by a tenth each way; a value outside it is coded at its end."""
        matrix = as_float_matrix(sample)
        quantiser = faiss.ScalarQuantizer(matrix.shape[1], faiss.ScalarQuantizer.QT_8bit)
        quantiser.rangestat_arg = 0.1
        quantiser.train(matrix)
        return cls(quantiser, np.zeros((n, quantiser.code_size), dtype=np.uint8))

    @classmethod
    def from_ranges(cls, ranges: np.ndarray, codes: np.ndarray) -> "CodedRows":
        """Codes kept from an earlier `trained` one, with its `ranges`."""
        quantiser = faiss.ScalarQuantizer(codes.shape[1], faiss.ScalarQuantizer.QT_8bit)
        if ranges.shape != (2 * quantiser.d,):
            raise ValueError(f"code ranges of shape {ranges.shape} for {quantiser.d}-d codes")
        faiss.copy_array_to_vector(np.ascontiguousarray(ranges, dtype=np.float32), quantiser.trained)
        return cls(quantiser, codes)

    def ranges(self) -> np.ndarray:
        """Each dimension's lowest value, then each one's width (what `from_ranges` takes)."""
        return faiss.vector_to_array(self.quantiser.trained)

    def put(self, start: int, rows: np.ndarray) -> None:
        """Code `rows` as rows start, start + 1, ..."""
        self.codes[start:start + len(rows)] = self.quantiser.compute_codes(as_float_matrix(rows))

    def __getitem__(self, ids) -> np.ndarray:
        """The decoded float32 rows at `ids` (an array of row numbers)."""
        return self.quantiser.decode(np.ascontiguousarray(self.codes[np.atleast_1d(ids)]))

    def __len__(self) -> int:
        return len(self.codes)

    @property
    def shape(self) -> tuple[int, int]:
        return len(self.codes), self.quantiser.d


def lists_for(n: int, kind: str) -> int:
    """IVF lists for `n` vectors: sqrt(n), 64 to 1024, for IVF; 2 sqrt(n), 64 to
    IVFPQ_MAX_LISTS, for IVF-PQ (see the module docstring)."""
    if kind == "ivf":
        return int(np.clip(np.sqrt(n), 64, 1024))
    return int(np.clip(2 * np.sqrt(n), 64, IVFPQ_MAX_LISTS))


def sub_quantisers(dim: int) -> int:
    """PQ sub-quantisers for `dim`: one per 8 dimensions (48 for 384), or the largest divisor below."""
    return next(m for m in range(max(dim // 8, 1), 0, -1) if dim % m == 0)


def _same_lists(index: faiss.Index, added: faiss.Index) -> bool:
    """Both are IVF indexes with the same centroids: searched together, they scan the same lists."""
    if not isinstance(faiss.downcast_index(index), faiss.IndexIVF) or not isinstance(faiss.downcast_index(added), faiss.IndexIVF):
        return False
    if (added.nlist, added.d) != (index.nlist, index.d):
        return False
    return np.array_equal(index.quantizer.reconstruct_n(0, index.nlist), added.quantizer.reconstruct_n(0, added.nlist))
