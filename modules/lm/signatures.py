"""The declarative LM steps of METHOD.md as DSPy signatures (steps 1, 4, 5, 10 and 11).

Each signature says what goes in and what comes out; the modules in `modules/lm/predictors.py` add the
built-in demonstrations and the checks that keep a small model's output usable.
"""

from __future__ import annotations

import dspy
from pydantic import BaseModel


class ExtractedFact(BaseModel):
    """One atomic fact and the entities it involves (a hyperedge, step 1)."""

    text: str
    entities: list[str]


class ExtractFacts(dspy.Signature):
    """List the entities the passage mentions (names, dates, numbers, objects, concepts that take
    part in a relation), then split the passage into atomic facts: short, self-contained
    statements that name their subject (no pronouns) and keep their qualifiers of time, place and
    cause."""

    title: str = dspy.InputField(desc="the passage title, usually its subject")
    passage: str = dspy.InputField()
    entities: list[str] = dspy.OutputField(desc="each entity once, as written in the passage")
    facts: list[str] = dspy.OutputField(desc="every fact the passage states, in order")


class ExtractEntities(dspy.Signature):
    """List the entities the passage mentions: names, dates, numbers, and the objects and concepts
    that take part in a relation."""

    title: str = dspy.InputField(desc="the passage title, usually its subject")
    passage: str = dspy.InputField()
    entities: list[str] = dspy.OutputField(desc="each entity once, as written in the passage")


class Decompose(dspy.Signature):
    """Break the question into the ordered sub-questions that answer it one hop at a time. A later
    sub-question refers to the answer of sub-question k as #k. A one-hop question stays whole."""

    question: str = dspy.InputField()
    sub_questions: list[str] = dspy.OutputField(desc="ordered sub-questions; the last one asks for the final answer")


class DecomposeComparisons(Decompose):
    """Break the question into the ordered sub-questions that answer it one hop at a time. A later
    sub-question refers to the answer of sub-question k as #k. Every sub-question keeps the names
    the question gives. A comparison gets one sub-question per compared thing. A one-hop
    question stays whole."""


FACTS_NOTE = ("The facts found for the whole question show which people, places and works it is about: "
              "name them in the sub-questions as the facts do, and do not answer the question.")
FACTS_FIELD = dspy.InputField(desc='facts found for the whole question, as "(passage title) statement"')


class RewriteBridge(dspy.Signature):
    """Rewrite the sub-question as a standalone question by replacing each #k with its resolved
    answer. Do not answer it."""

    sub_question: str = dspy.InputField(desc="a sub-question that refers to earlier answers as #k")
    resolved: list[str] = dspy.InputField(desc='the earlier answers, as "#k = answer"')
    question: str = dspy.OutputField(desc="the standalone question")


class AnswerHop(dspy.Signature):
    """Answer the question from the numbered evidence facts with a short phrase (a name, date or
    number), and list the numbers of the facts that support it."""

    question: str = dspy.InputField()
    evidence: list[str] = dspy.InputField(desc='facts as "[number] (passage title) statement"')
    answer: str = dspy.OutputField(desc="a short phrase, not a sentence")
    supporting: list[int] = dspy.OutputField(desc="numbers of the facts the answer rests on")


class GenerateAnswer(dspy.Signature):
    """Answer the multi-hop question from the evidence chain with a short phrase (a name, date or
    number), as it appears in the evidence."""

    question: str = dspy.InputField()
    evidence: list[str] = dspy.InputField(desc="the answered sub-questions, then the supporting facts")
    answer: str = dspy.OutputField(desc="a short phrase, not a sentence")


class ChooseAnswer(dspy.Signature):
    """The question names the answers it allows. Answer it with the one option the evidence
    supports, written as in the options."""

    question: str = dspy.InputField()
    options: list[str] = dspy.InputField(desc="the answers the question allows")
    evidence: list[str] = dspy.InputField(desc="what the reader was given to answer the question")
    answer: str = dspy.OutputField(desc="one of the options")
