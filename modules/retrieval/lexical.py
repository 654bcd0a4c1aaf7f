"""`LexicalIndex`: BM25 over the facts, for the retriever's lexical seeds and score term.

A dense embedder matches meaning and misses names it has never seen: a flag, a setting, an
environment variable or a command of a software manual ("CARGO_BUILD_JOBS", "`cargo fix
--edition`") is a rare token that BM25 weighs highly and a small sentence embedder blurs. The
facts are read as "title\\ntext", the text the passage search reads, so a fact of a section
carries the section's heading words. BM25 as the bm25 peer computes it (`bm25s`, Lucene variant,
k1 1.5, b 0.75, English stopwords), so that the two agree on what a word is worth.
"""

from __future__ import annotations

from typing import Sequence

import bm25s
import numpy as np


class LexicalIndex:
    """Each fact's BM25 score for a query, over all facts at once (bm25s keeps the scores of
    each word as a sparse column, so a query costs the postings of its words)."""

    def __init__(self, texts: Sequence[str]):
        self.n_facts = len(texts)
        self.bm25 = bm25s.BM25(k1=1.5, b=0.75, method="lucene")
        if self.n_facts:
            self.bm25.index(bm25s.tokenize(list(texts), stopwords="en", show_progress=False), show_progress=False)

    def scores(self, query: str) -> np.ndarray:
        """BM25 of every fact for `query` (float32, one per fact; 0 where no word is shared)."""
        words = bm25s.tokenize(query, stopwords="en", return_ids=False, show_progress=False)[0]
        if not self.n_facts or not words:
            return np.zeros(self.n_facts, dtype=np.float32)
        return np.asarray(self.bm25.get_scores(words), dtype=np.float32)
