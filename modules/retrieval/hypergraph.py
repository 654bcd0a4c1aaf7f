"""The atomic-fact hypergraph and its fact-to-fact transitions (METHOD.md steps 2, 3 and 7).

W_s = B_he D_e^-1 B_he^T + B_hd D_d^-1 B_hd^T is never materialised. Row i of W_s is produced
from the factors, and its off-diagonal sum is |A_i+| + 1 - W_s[i,i] (each column of
B_he D_e^-1 sums to 1 over facts, and so does each column of B_hd D_d^-1), so every row of
T_s = RowNormalize(W_s - diag(W_s)) is available on demand in time proportional to the
degrees of the entities and the passage that fact i touches.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from modules.errors import HyperProveError


def binary_csr(rows: np.ndarray, cols: np.ndarray, shape: tuple[int, int]) -> sp.csr_matrix:
    """0/1 CSR matrix with a 1 wherever (row, col) occurs at least once."""
    matrix = sp.csr_matrix((np.ones(len(rows), dtype=np.float64), (rows, cols)), shape=shape)
    matrix.sum_duplicates()
    matrix.data[:] = 1.0
    return matrix


def expand_synonyms(incidence: sp.csr_matrix, synonyms: sp.csr_matrix) -> sp.csr_matrix:
    """Step 2: A_i+ = A_i ∪ Syn(A_i), one synonym step (no transitive closure)."""
    expanded = (incidence + incidence @ synonyms).tocsr()
    expanded.data[:] = 1.0
    expanded.eliminate_zeros()
    expanded.sort_indices()
    return expanded


def scale_columns(matrix: sp.csr_matrix, factor: np.ndarray) -> sp.csr_matrix:
    """matrix @ diag(factor), by scaling the stored entries (no dense intermediate)."""
    scaled = matrix.tocsr(copy=True)
    scaled.data = scaled.data * factor[scaled.indices]
    return scaled


class Hypergraph:
    """Facts (rows) over expanded entities and passages, with T_s produced on demand.

    `incidence` is B_he with A_i+ (synonyms already added); `fact_passage[i]` is the passage id
    of fact i, so B_hd has exactly one 1 per row.
    """

    def __init__(self, incidence: sp.csr_matrix, fact_passage: np.ndarray, n_passages: int):
        fact_passage = np.asarray(fact_passage, dtype=np.int64)
        n_facts = incidence.shape[0]
        if len(fact_passage) != n_facts:
            raise HyperProveError(f"hypergraph: {n_facts} incidence rows but {len(fact_passage)} fact passages")
        if n_facts and (fact_passage.min() < 0 or fact_passage.max() >= n_passages):
            raise HyperProveError(f"hypergraph: fact passage ids must lie in [0, {n_passages})")
        self.B_he = incidence.tocsr().astype(np.float64)
        self.B_he.data[:] = 1.0
        self.B_eh = self.B_he.T.tocsr()
        self.B_hd = binary_csr(np.arange(n_facts), fact_passage, (n_facts, n_passages))
        self.B_dh = self.B_hd.T.tocsr()
        self.fact_passage = fact_passage
        entity_degree = np.asarray(self.B_he.sum(axis=0)).ravel()
        passage_degree = np.bincount(fact_passage, minlength=n_passages).astype(np.float64)
        self.inv_entity_degree = np.divide(1.0, entity_degree, out=np.zeros_like(entity_degree), where=entity_degree > 0)
        self.inv_passage_degree = np.divide(1.0, passage_degree, out=np.zeros_like(passage_degree), where=passage_degree > 0)
        # W_s[i,i] and the off-diagonal row sum |A_i+| + 1 - W_s[i,i] (step 3 note).
        self.self_weight = self.B_he @ self.inv_entity_degree + self.inv_passage_degree[fact_passage]
        n_entities_per_fact = np.diff(self.B_he.indptr).astype(np.float64)
        self.off_diagonal_sum = np.maximum(n_entities_per_fact + 1.0 - self.self_weight, 0.0)
        self.off_diagonal_sum[self.off_diagonal_sum < 1e-12] = 0.0

    @property
    def n_facts(self) -> int:
        return self.B_he.shape[0]

    @property
    def n_entities(self) -> int:
        return self.B_he.shape[1]

    @property
    def n_passages(self) -> int:
        return self.B_hd.shape[1]

    # --- step 3 ------------------------------------------------------------------------------
    def weights(self, rows: np.ndarray, cols: np.ndarray | None = None) -> sp.csr_matrix:
        """W_s[rows, cols] with the diagonal removed (cols=None: all facts; else sorted, unique)."""
        rows = np.asarray(rows, dtype=np.int64)
        entity_part = scale_columns(self.B_he[rows], self.inv_entity_degree)
        passage_part = scale_columns(self.B_hd[rows], self.inv_passage_degree)
        if cols is None:
            block = entity_part @ self.B_eh + passage_part @ self.B_dh
            diagonal_cols = rows
        else:
            cols = np.asarray(cols, dtype=np.int64)
            block = entity_part @ self.B_he[cols].T + passage_part @ self.B_hd[cols].T
            position = np.minimum(np.searchsorted(cols, rows), len(cols) - 1)
            diagonal_cols = np.where(cols[position] == rows, position, -1) if len(cols) else np.full(len(rows), -1)
        has_diagonal = diagonal_cols >= 0
        diagonal = sp.csr_matrix(
            (self.self_weight[rows][has_diagonal], (np.flatnonzero(has_diagonal), diagonal_cols[has_diagonal])),
            shape=block.shape,
        )
        block = (block - diagonal).tocsr()
        block.data[np.abs(block.data) < 1e-12] = 0.0
        block.eliminate_zeros()
        return block

    def transition_rows(self, rows: np.ndarray) -> sp.csr_matrix:
        """Rows of T_s = RowNormalize(W_s - diag(W_s)); a fact linked to nothing has a zero row."""
        rows = np.asarray(rows, dtype=np.int64)
        scale = np.divide(1.0, self.off_diagonal_sum[rows], out=np.zeros(len(rows)), where=self.off_diagonal_sum[rows] > 0)
        return sp.diags(scale) @ self.weights(rows)

    # --- step 7 ------------------------------------------------------------------------------
    def propagate(self, nodes: np.ndarray, mass: np.ndarray, epsilon: float) -> tuple[np.ndarray, np.ndarray]:
        """One walk step p -> p T_s over the factors, with sparse vectors (ids, mass).

        Push-style pruning (as in approximate PPR): an entity or passage spreads its mass only
        when each of its facts would receive more than `epsilon`; hub entities seen with little
        mass therefore cost nothing. Mass that would return to its own fact (the diagonal) is
        removed, as in T_s.
        """
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(self.off_diagonal_sum[nodes] > 0, mass / self.off_diagonal_sum[nodes], 0.0)
        targets, values = [], []
        for forward, backward, inv_degree in (
            (self.B_he, self.B_eh, self.inv_entity_degree),
            (self.B_hd, self.B_dh, self.inv_passage_degree),
        ):
            block = forward[nodes]
            entry_owner = np.repeat(np.arange(len(nodes)), np.diff(block.indptr))
            hubs, entry_hub = np.unique(block.indices, return_inverse=True)
            per_fact = np.bincount(entry_hub, weights=share[entry_owner]) * inv_degree[hubs]
            spread = per_fact > epsilon
            reach = backward[hubs[spread]]
            targets.append(reach.indices)
            values.append(np.repeat(per_fact[spread], np.diff(reach.indptr)))
            # remove the diagonal: fact i got share_i / D[h] back from each of its spreading hubs
            returned = np.bincount(entry_owner, weights=spread[entry_hub] * inv_degree[hubs][entry_hub], minlength=len(nodes))
            targets.append(nodes)
            values.append(-share * returned)
        ids, inverse = np.unique(np.concatenate(targets), return_inverse=True)
        total = np.bincount(inverse, weights=np.concatenate(values))
        keep = total > 1e-15
        return ids[keep], total[keep]

    def local_subgraph(self, seeds: np.ndarray, bound: int, steps: int, epsilon: float) -> np.ndarray:
        """Step 7: at most `bound` facts around the seeds, by random-walk visiting mass.

        The walk starts uniform on the seeds and runs `steps` steps of T_s; a fact's visiting
        mass is the sum over steps. Seeds are always kept (even beyond the bound); the rest are
        the largest visiting masses, ties broken by fact id so the result is deterministic.
        Returns sorted fact ids.
        """
        seeds = np.unique(np.asarray(seeds, dtype=np.int64))
        if len(seeds) == 0:
            return seeds
        nodes, mass = seeds, np.full(len(seeds), 1.0 / len(seeds))
        visited_ids, visited_mass = [nodes], [mass]
        for _ in range(steps):
            nodes, mass = self.propagate(nodes, mass, epsilon)
            if len(nodes) == 0:
                break
            visited_ids.append(nodes)
            visited_mass.append(mass)
        ids, inverse = np.unique(np.concatenate(visited_ids), return_inverse=True)
        visit = np.bincount(inverse, weights=np.concatenate(visited_mass))
        others = ~np.isin(ids, seeds)
        room = max(bound - len(seeds), 0)
        candidates, candidate_visit = ids[others], visit[others]
        if len(candidates) > room:
            order = np.lexsort((candidates, -candidate_visit))[:room]
            candidates = candidates[order]
        return np.union1d(seeds, candidates)

    def local_transitions(self, nodes: np.ndarray) -> sp.csr_matrix:
        """T*_t: T_s restricted to the subgraph and row-normalised again.

        Restricting T_s and renormalising equals renormalising W_s - diag(W_s) restricted, so
        the global row sums are not needed here.
        """
        block = self.weights(nodes, nodes)
        row_sum = np.asarray(block.sum(axis=1)).ravel()
        scale = np.divide(1.0, row_sum, out=np.zeros_like(row_sum), where=row_sum > 0)
        return (sp.diags(scale) @ block).tocsr()
