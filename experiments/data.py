"""Loaders for the benchmark files: the project's schema (../shared/data) and HippoRAG's native files.

Every malformed file gives one HyperProveError naming the file, the item and the field.

A question in the project's schema gives its gold passages by id (`gold_passages`), or as
evidence quotes (`evidence`: [{"file", "quote"}]) for a corpus read from a folder of documents:
its gold passages are then whichever passages hold a quote (`quoted_passages`), so that recall
works for any chunking of the folder.

Native HippoRAG question files are recognised by their fields: MuSiQue items carry
`paragraphs` (with `is_supporting`) and `question_decomposition`; 2Wiki and HotpotQA items
carry `context` ([title, sentences]) and `supporting_facts` ([title, sentence id]). Their gold
passages are found in the corpus by title and text, compared without whitespace (HippoRAG
joins sentences with and without spaces depending on the dataset).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from modules.errors import HyperProveError
from modules.facts import Passage
from modules.lm.references import references
from pipeline.index.corpus import json_field, read_json_list


@dataclass(frozen=True)
class GoldHop:
    """One gold hop: a sub-question of a gold decomposition (MuSiQue, 2Wiki), its answer and passage; "#k" refers to hop k's answer."""

    question: str
    answer: str
    passage: int | None


@dataclass(frozen=True)
class Evidence:
    """A quote copied from a document of the folder (`file`, its path in the folder), and the
    passages of the corpus that hold it (none: the reader or the chunking lost it)."""

    file: str
    quote: str
    passages: tuple[int, ...]


@dataclass(frozen=True)
class Question:
    id: str
    question: str
    answer: str
    answer_aliases: tuple[str, ...] = ()
    type: str = ""
    gold_passages: tuple[int, ...] = ()
    decomposition: tuple[GoldHop, ...] = ()
    evidence: tuple[Evidence, ...] = ()


def _squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


def held_length(piece_of: Callable[[int], str], length: int, text: str) -> int:
    """The longest `n` <= `length` with `piece_of(n)` in `text`: a quote's longest beginning (or
    ending) that a passage holds. Holding is monotone in `n`, so a binary search finds it."""
    low, high = 0, length
    while low < high:
        middle = (low + high + 1) // 2
        if piece_of(middle) in text:
            low = middle
        else:
            high = middle - 1
    return low


def quoted_passages(quote: str, file: str, corpus: Sequence[Passage]) -> tuple[int, ...]:
    """The passages of `file` (all passages, if none came from it) that hold `quote`, spaces
    ignored: the whole quote, or, where no passage holds it whole, at least half of it as its
    beginning or its end. That finds a quote cut by a passage boundary (in both passages) and
    one that starts with a heading the reader moved into the passage's title."""
    own = [k for k, passage in enumerate(corpus) if passage.source and _same_file(passage.source.rpartition("#")[0], file)]
    candidates = own or range(len(corpus))
    wanted = _squash(quote)
    texts = {k: _squash(corpus[k].text) for k in candidates}
    whole = tuple(k for k, text in texts.items() if wanted in text)
    if whole or not wanted:
        return whole
    half = (len(wanted) + 1) // 2
    return tuple(k for k, text in texts.items()
                 if max(held_length(lambda n: wanted[:n], len(wanted), text), held_length(lambda n: wanted[len(wanted) - n:], len(wanted), text)) >= half)


def _same_file(source_file: str, file: str) -> bool:
    """A passage's file, as the folder read named it, is the quoted `file`, or ends with it (a folder read from above the one the quotes name)."""
    return source_file == file or source_file.endswith("/" + file.lstrip("/"))


class _PassageLookup:
    """Corpus passages by (title, text without whitespace), for HippoRAG's native question files."""

    def __init__(self, corpus: list[Passage]):
        self.by_key = {}
        for position, passage in enumerate(corpus):
            self.by_key.setdefault((passage.title, _squash(passage.text)), position)

    def find(self, path: Path, position: int, title: str, text: str) -> int:
        key = (title, _squash(text))
        if key not in self.by_key:
            raise HyperProveError(f'{path}: item {position}: supporting passage "{title}" is not in the corpus')
        return self.by_key[key]


def load_questions(path: str | Path, corpus: list[Passage] | None = None, locate_quotes: bool = True) -> list[Question]:
    """Questions in the project schema, or HippoRAG's native files (then `corpus` is needed).
    Evidence quotes are located in `corpus`; with `locate_quotes` False they are kept unlocated
    (no passages), for a reader of types and answers that has no corpus at hand (the report)."""
    path = Path(path)
    items = read_json_list(path, "questions")
    if not items:
        raise HyperProveError(f"{path}: the question list is empty")
    native = isinstance(items[0], dict) and ("paragraphs" in items[0] or "context" in items[0])
    if native and corpus is None:
        raise HyperProveError(f"{path}: HippoRAG-format questions need the corpus to locate gold passages")
    lookup = _PassageLookup(corpus) if native else None
    questions, first_seen = [], {}
    for k, item in enumerate(items):
        question = _native_question(path, k, item, lookup) if native else _schema_question(path, k, item, corpus, locate_quotes)
        if not question.question.strip():
            raise HyperProveError(f'{path}: item {k}: field "question" is empty')
        earlier = first_seen.setdefault(question.id, k)
        if earlier != k:
            raise HyperProveError(f'{path}: items {earlier} and {k} have the same id {question.id!r}; ids name questions in results')
        _check_references(path, k, question.decomposition)
        questions.append(question)
    return questions


def _check_references(path: Path, position: int, steps: tuple[GoldHop, ...]) -> None:
    """Gold hop k's "#j" must name an earlier hop: a reference to a missing or later one cannot be filled."""
    for k, step in enumerate(steps):
        for reference in references(step.question):
            if not 1 <= reference <= k:
                raise HyperProveError(f'{path}: item {position} decomposition[{k}]: "#{reference}" refers to no earlier step '
                                      f"({step.question!r})")


def _answer_text(path: Path, position: int, item: dict) -> str:
    answer = json_field(path, position, item, "answer", (str, list))
    if isinstance(answer, list):
        if not answer or not all(isinstance(a, str) for a in answer):
            raise HyperProveError(f'{path}: item {position}: field "answer" must be a string or a list of strings')
        return answer[0]
    return answer


def _schema_question(path: Path, position: int, item, corpus: list[Passage] | None, locate_quotes: bool = True) -> Question:
    n_passages = len(corpus) if corpus is not None else None
    gold = json_field(path, position, item, "gold_passages", list, required=False, default=[])
    evidence = _evidence(path, position, item, corpus, locate_quotes)
    if evidence and "gold_passages" not in item:
        gold = list(dict.fromkeys(k for quoted in evidence for k in quoted.passages))
    for value in gold:
        if not isinstance(value, int) or isinstance(value, bool) or value < 0 or (n_passages is not None and value >= n_passages):
            raise HyperProveError(f'{path}: item {position}: field "gold_passages" holds {value!r}, not a corpus index')
    steps = []
    for k, step in enumerate(json_field(path, position, item, "decomposition", list, required=False, default=[])):
        where = f"{position} decomposition[{k}]"
        passage = step.get("passage") if isinstance(step, dict) else None
        steps.append(GoldHop(
            question=json_field(path, where, step, "question", str),
            answer=json_field(path, where, step, "answer", str),
            passage=passage if isinstance(passage, int) else None,
        ))
    aliases = json_field(path, position, item, "answer_aliases", list, required=False, default=[])
    return Question(
        id=str(json_field(path, position, item, "id", (str, int))),
        question=json_field(path, position, item, "question", str),
        answer=_answer_text(path, position, item),
        answer_aliases=tuple(a for a in aliases if isinstance(a, str)),
        type=str(item.get("type", "")),
        gold_passages=tuple(gold),
        decomposition=tuple(steps),
        evidence=evidence,
    )


def _evidence(path: Path, position: int, item, corpus: list[Passage] | None, locate: bool = True) -> tuple[Evidence, ...]:
    """A question's evidence quotes, each with the passages that hold it (`quoted_passages`).
    2Wiki's evidence is triples ([subject, relation, object]), which its decomposition already holds: none."""
    listed = json_field(path, position, item, "evidence", list, required=False, default=[])
    if all(isinstance(entry, list) for entry in listed):
        return ()
    if listed and corpus is None and locate:
        raise HyperProveError(f'{path}: item {position}: field "evidence" gives quotes; they need the corpus to find their passages')
    quotes = []
    for k, entry in enumerate(listed):
        where = f"{position} evidence[{k}]"
        if not isinstance(entry, dict):
            raise HyperProveError(f'{path}: item {where} must be {{"file": ..., "quote": ...}}')
        file, quote = json_field(path, where, entry, "file", str), json_field(path, where, entry, "quote", str)
        if not quote.strip():
            raise HyperProveError(f'{path}: item {where}: field "quote" is empty')
        quotes.append(Evidence(file, quote, quoted_passages(quote, file, corpus) if locate else ()))
    return tuple(quotes)


def unfound_quotes(questions: Sequence[Question]) -> list[str]:
    """One line for each evidence quote that no passage holds ("id: 'quote' (file)")."""
    return [f"{q.id}: {quoted.quote[:60]!r} ({quoted.file})" for q in questions for quoted in q.evidence if not quoted.passages]


def _native_question(path: Path, position: int, item, lookup: _PassageLookup) -> Question:
    if not isinstance(item, dict):
        raise HyperProveError(f"{path}: item {position} is not a JSON object")
    if "paragraphs" in item:  # MuSiQue
        gold = []
        for k, paragraph in enumerate(json_field(path, position, item, "paragraphs", list)):
            where = f"{position} paragraphs[{k}]"
            if not isinstance(paragraph, dict):
                raise HyperProveError(f"{path}: item {where} is not a JSON object")
            if paragraph.get("is_supporting"):
                gold.append(lookup.find(path, position, json_field(path, where, paragraph, "title", str),
                                        json_field(path, where, paragraph, "paragraph_text", str)))
        steps = tuple(
            GoldHop(question=json_field(path, f"{position} question_decomposition[{k}]", step, "question", str),
                 answer=json_field(path, f"{position} question_decomposition[{k}]", step, "answer", str), passage=None)
            for k, step in enumerate(json_field(path, position, item, "question_decomposition", list, required=False, default=[]))
        )
    else:  # 2WikiMultihopQA, HotpotQA: context [[title, [sentence, ...]], ...], supporting_facts [[title, sentence id], ...]
        context = {}
        for k, entry in enumerate(json_field(path, position, item, "context", list)):
            if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str) and isinstance(entry[1], list)
                    and all(isinstance(sentence, str) for sentence in entry[1])):
                raise HyperProveError(f'{path}: item {position}: context[{k}] must be [title, [sentence, ...]] (texts)')
            context[entry[0]] = entry[1]
        titles = {}
        for k, fact in enumerate(json_field(path, position, item, "supporting_facts", list)):
            if not (isinstance(fact, list) and fact and isinstance(fact[0], str)):
                raise HyperProveError(f'{path}: item {position}: supporting_facts[{k}] must be [title, sentence id], found {fact!r}'[:300])
            titles[fact[0]] = None
        gold = [lookup.find(path, position, title, "".join(context.get(title, []))) for title in titles]
        steps = ()
    identifier = item.get("id", item.get("_id"))
    if identifier is None:
        raise HyperProveError(f'{path}: item {position}: field "id" (or "_id") is missing')
    aliases = item.get("answer_aliases", [])
    return Question(
        id=str(identifier),
        question=json_field(path, position, item, "question", str),
        answer=_answer_text(path, position, item),
        answer_aliases=tuple(a for a in aliases if isinstance(a, str)) if isinstance(aliases, list) else (),
        type=str(item.get("type", "")),
        gold_passages=tuple(dict.fromkeys(gold)),
        decomposition=steps,
    )
