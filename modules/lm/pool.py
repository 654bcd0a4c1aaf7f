"""Demonstrations chosen by similarity: the idea of DSPy's KNNFewShot, kept as data.

A predictor holds a `pool` of labelled examples (gold steps, written by `hyperprove compile
--optimizer similar`) and shows its fixed `demos` followed by the `per_call` pool examples
nearest to what it is asked (cosine of the query encoder's vectors). `by` says nearest to what:
- "call": the call's first input field (a hop's own question), chosen anew on every call;
- "question": the question the whole program was asked, against the question each example was
  made for (its `asked`): every call of one question shows the same demonstrations, so the LM
  server's prompt cache keeps them from one hop to the next.
The pool is part of the predictor's saved state, so a program file carries it; the encoder is
the retriever's, given with each call, so choosing costs no LM call and no file.
"""

from __future__ import annotations

from typing import Callable, Literal, Sequence

import dspy
import numpy as np

from modules.lm.checks import single_spaced
from modules.lm.demos import COMPARISON_DEMOS, DECOMPOSE_DEMOS, DOC_COMPARISON_DEMOS, DOC_DECOMPOSE_DEMOS

Encode = Callable[[str], np.ndarray]
MAX_PER_CALL = 16  # pool demonstrations a call may be shown
BY = ("call", "question")
ASKED = "asked"  # the key of a pool example that holds the question it was made for


def unit_rows(encode: Encode, texts: Sequence[str]) -> np.ndarray:
    """The texts' vectors, one row each, scaled to length 1 (so that products are cosines)."""
    rows = np.stack([np.asarray(encode(str(text)), dtype=np.float32).ravel() for text in texts])
    return rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)


def representatives(vectors: np.ndarray, k: int) -> list[int]:
    """`k` rows that together resemble all rows best: greedy facility location (each row is
    served by its most similar chosen row; each pick adds the most to the sum of those
    similarities, negative ones counted as 0), ties to the lower index. For demonstrations fixed
    once for every question."""
    similarity = np.clip(vectors @ vectors.T, 0.0, None)
    served, chosen = np.zeros(len(vectors), dtype=np.float32), []
    for _ in range(min(k, len(vectors))):
        gain = np.maximum(similarity - served[:, None], 0.0).sum(axis=0)
        gain[chosen] = -1.0
        best = int(np.argmax(gain))
        chosen.append(best)
        served = np.maximum(served, similarity[:, best])
    return chosen


class PooledPredict(dspy.Predict):
    """`dspy.Predict` with an optional pool of demonstrations chosen by similarity (see the module)."""

    def __init__(self, signature, demos=()):
        super().__init__(signature)
        self.demos = list(demos)
        self.pool: list[dict] = []
        self.per_call = 0
        self.by: Literal["call", "question"] = "call"
        self._vectors: tuple[int, np.ndarray] | None = None  # the pool's keys, encoded once per encoder (by its id: copies stay light)

    @property
    def question_field(self) -> str:
        """The signature's first input: the question a call asks."""
        return next(iter(self.signature.input_fields))

    @property
    def key(self) -> str:
        """The field of a pool example searched: the question field, or `asked` by question."""
        return ASKED if self.by == "question" else self.question_field

    def use_pool(self, pool: list[dict], per_call: int, by: str = "call") -> None:
        """Raises ValueError for a pool example without one of the signature's fields (or `asked`, by question)."""
        if by not in BY:
            raise ValueError(f"by must be one of {', '.join(BY)}, not {by!r}")
        fields = list(self.signature.fields) + ([ASKED] if by == "question" else [])
        for number, example in enumerate(pool, start=1):
            missing = [field for field in fields if field not in example]
            if missing:
                raise ValueError(f"pool example {number} has no {missing[0]!r} (the predictor reads {', '.join(fields)})")
        self.pool, self.per_call, self.by, self._vectors = [dict(example) for example in pool], per_call, by, None

    def nearest(self, text: str, encode: Encode) -> list[dict]:
        """The `per_call` pool examples whose key is most similar to `text`, the nearest last (next
        to the question), examples of one source question in their order; an example whose key is
        `text` itself is never chosen (no answer leaks)."""
        if self._vectors is None or self._vectors[0] != id(encode):
            self._vectors = (id(encode), unit_rows(encode, [example[self.key] for example in self.pool]))
        similarity = self._vectors[1] @ unit_rows(encode, [text])[0]
        asked = single_spaced(text).lower()
        order = [i for i in np.lexsort((np.arange(len(self.pool)), -similarity)) if single_spaced(self.pool[i][self.key]).lower() != asked]
        chosen = sorted(order[: self.per_call], key=lambda i: (similarity[i], i))
        fields = list(self.signature.fields)
        return [{field: self.pool[i][field] for field in fields} for i in chosen]

    def forward(self, encode: Encode | None = None, asked: str | None = None, **kwargs):
        """With a pool and an `encode`, this call's demos are the fixed ones and the nearest of the
        pool to the call (or, by question, to `asked`, the question the program was asked)."""
        if self.pool and self.per_call and encode is not None and "demos" not in kwargs:
            text = asked if self.by == "question" and asked is not None else kwargs[self.question_field]
            kwargs["demos"] = list(self.demos) + self.nearest(str(text), encode)
        return super().forward(**kwargs)

    def dump_state(self, json_mode=True):
        state = super().dump_state(json_mode)
        if self.pool:
            state.update(pool=[dict(example) for example in self.pool], per_call=self.per_call)
            if self.by != "call":
                state["by"] = self.by
        return state

    def load_state(self, state: dict, **options) -> "PooledPredict":
        state = dict(state)
        pool, per_call, by = state.pop("pool", []), state.pop("per_call", 0), state.pop("by", "call")
        super().load_state(state, **options)
        self.use_pool(pool, per_call, by)
        return self


DOCUMENTATION_MARGIN = 0.1  # cosine by which a question must be nearer the documentation demonstrations (chosen on train: FINDINGS)


class QuestionShape:
    """Whether a question is about a software manual, so that it is shown the documentation
    demonstrations (`modules.lm.demos.DOC_*`): its nearest documentation demonstration question
    is nearer, by DOCUMENTATION_MARGIN cosine, than its nearest encyclopedia one. The question is
    routed by what it resembles, with no rule about its words; the demonstration questions are
    encoded once per encoder."""

    ENCYCLOPEDIA = [demo.question for demo in DECOMPOSE_DEMOS + COMPARISON_DEMOS]
    DOCUMENTATION = [demo.question for demo in DOC_DECOMPOSE_DEMOS + DOC_COMPARISON_DEMOS]

    def __init__(self, margin: float = DOCUMENTATION_MARGIN):
        self.margin = margin
        self._vectors: tuple[int, np.ndarray, np.ndarray] | None = None

    def margin_of(self, question: str, encode: Encode) -> float:
        """How much nearer the question is to the documentation demonstrations (cosine)."""
        if self._vectors is None or self._vectors[0] != id(encode):
            self._vectors = (id(encode), unit_rows(encode, self.ENCYCLOPEDIA), unit_rows(encode, self.DOCUMENTATION))
        vector = unit_rows(encode, [question])[0]
        return float((self._vectors[2] @ vector).max() - (self._vectors[1] @ vector).max())

    def documentation(self, question: str, encode: Encode) -> bool:
        return self.margin_of(question, encode) > self.margin
