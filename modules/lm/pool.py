"""Demonstrations chosen for each call by similarity: the idea of DSPy's KNNFewShot, kept as data.

A predictor holds a `pool` of labelled examples (gold steps, written by `hyperprove compile
--optimizer similar`) and, on each call, shows its fixed `demos` followed by the `per_call` pool
examples whose first input field is nearest to the call's (cosine of the query encoder's
vectors). The pool is part of the predictor's saved state, so a program file carries it; the
encoder is the retriever's, given with each call, so choosing costs no LM call and no file.
"""

from __future__ import annotations

from typing import Callable

import dspy
import numpy as np

Encode = Callable[[str], np.ndarray]
MAX_PER_CALL = 16  # pool demonstrations a call may be shown


def _same_text(a: str, b: str) -> bool:
    return " ".join(a.lower().split()) == " ".join(b.lower().split())


class PooledPredict(dspy.Predict):
    """`dspy.Predict` with an optional pool of demonstrations chosen per call (see the module)."""

    def __init__(self, signature, demos=()):
        super().__init__(signature)
        self.demos = list(demos)
        self.pool: list[dict] = []
        self.per_call = 0
        self._vectors: tuple[int, np.ndarray] | None = None  # the pool's keys, encoded once per encoder (by its id: copies stay light)

    @property
    def key(self) -> str:
        """The input field the pool is searched by: the signature's first (the question)."""
        return next(iter(self.signature.input_fields))

    def use_pool(self, pool: list[dict], per_call: int) -> None:
        """Raises ValueError for a pool example without one of the signature's fields."""
        fields = list(self.signature.fields)
        for number, example in enumerate(pool, start=1):
            missing = [field for field in fields if field not in example]
            if missing:
                raise ValueError(f"pool example {number} has no {missing[0]!r} (a {self.signature.__name__} example holds {', '.join(fields)})")
        self.pool, self.per_call, self._vectors = [dict(example) for example in pool], per_call, None

    def nearest(self, text: str, encode: Encode) -> list[dict]:
        """The `per_call` pool examples most similar to `text`, the nearest last (next to the
        question); an example whose key is `text` itself is never chosen (no answer leaks)."""
        if self._vectors is None or self._vectors[0] != id(encode):
            keys = np.stack([np.asarray(encode(str(example[self.key])), dtype=np.float32).ravel() for example in self.pool])
            keys /= np.maximum(np.linalg.norm(keys, axis=1, keepdims=True), 1e-12)
            self._vectors = (id(encode), keys)
        query = np.asarray(encode(text), dtype=np.float32).ravel()
        similarity = self._vectors[1] @ (query / max(float(np.linalg.norm(query)), 1e-12))
        order = [i for i in np.lexsort((np.arange(len(self.pool)), -similarity)) if not _same_text(str(self.pool[i][self.key]), text)]
        return [self.pool[i] for i in reversed(order[: self.per_call])]

    def forward(self, encode: Encode | None = None, **kwargs):
        """With a pool and an `encode`, this call's demos are the fixed ones and the nearest of the pool."""
        if self.pool and self.per_call and encode is not None and "demos" not in kwargs:
            kwargs["demos"] = list(self.demos) + self.nearest(str(kwargs[self.key]), encode)
        return super().forward(**kwargs)

    def dump_state(self, json_mode=True):
        state = super().dump_state(json_mode)
        if self.pool:
            state.update(pool=[dict(example) for example in self.pool], per_call=self.per_call)
        return state

    def load_state(self, state: dict, **options) -> "PooledPredict":
        state = dict(state)
        pool, per_call = state.pop("pool", []), state.pop("per_call", 0)
        super().load_state(state, **options)
        self.use_pool(pool, per_call)
        return self
