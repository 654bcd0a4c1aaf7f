"""The synthetic corpus the scale and change benchmarks share: random unit vectors stand in for
text embeddings (384-d, as MiniLM), and facts name entities drawn from a skewed distribution."""

from __future__ import annotations

import numpy as np

DIM = 384


def unit_vectors(rng: np.random.Generator, n: int, chunk: int = 100_000) -> np.ndarray:
    out = np.empty((n, DIM), dtype=np.float32)
    for start in range(0, n, chunk):
        block = rng.standard_normal((min(chunk, n - start), DIM), dtype=np.float32)
        block /= np.linalg.norm(block, axis=1, keepdims=True)
        out[start : start + len(block)] = block
    return out


def synthetic_corpus(n_facts: int, seed: int = 0):
    """Fact -> entity incidence (skewed), fact -> passage ids, and the three vector sets."""
    from modules.retrieval.hypergraph import binary_csr

    rng = np.random.default_rng(seed)
    n_entities = max(n_facts // 5, 10)
    per_fact = rng.integers(1, 5, size=n_facts)
    weights = 1.0 / (np.arange(n_entities) + 20.0)
    entity_of = rng.choice(n_entities, size=int(per_fact.sum()), p=weights / weights.sum())
    fact_of = np.repeat(np.arange(n_facts), per_fact)
    incidence = binary_csr(fact_of, entity_of, (n_facts, n_entities))
    sizes = rng.integers(1, 8, size=n_facts)  # more than enough passages
    passage_of = np.repeat(np.arange(n_facts), sizes)[:n_facts]
    return incidence, passage_of, int(passage_of[-1]) + 1, unit_vectors(rng, n_facts), unit_vectors(rng, n_entities)
