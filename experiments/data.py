"""Loaders for the benchmark files: the project's schema (../shared/data) and HippoRAG's native files.

Every malformed file gives one HyperProveError naming the file, the item and the field.

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

from modules.errors import HyperProveError
from modules.facts import Passage
from pipeline.files import read_json


@dataclass(frozen=True)
class Step:
    """One gold sub-question of a MuSiQue decomposition; "#k" refers to step k's answer."""

    question: str
    answer: str
    passage: int | None


@dataclass(frozen=True)
class Question:
    id: str
    question: str
    answer: str
    answer_aliases: tuple[str, ...] = ()
    type: str = ""
    gold_passages: tuple[int, ...] = ()
    decomposition: tuple[Step, ...] = ()


def _read_json_list(path: Path, what: str) -> list:
    value = read_json(path, what)
    if not isinstance(value, list):
        raise HyperProveError(f"{path}: a {what} file holds a JSON list, found {type(value).__name__}")
    return value


def _field(path: Path, position: int, item, name: str, kind: type | tuple, required: bool = True, default=None):
    if not isinstance(item, dict):
        raise HyperProveError(f"{path}: item {position} is not a JSON object")
    if name not in item:
        if required:
            raise HyperProveError(f'{path}: item {position}: field "{name}" is missing')
        return default
    value = item[name]
    if not isinstance(value, kind) or isinstance(value, bool):
        expected = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise HyperProveError(f'{path}: item {position}: field "{name}" must be {expected}, found {type(value).__name__}')
    return value


def load_corpus(path: str | Path) -> list[Passage]:
    """A list of {"title", "text"} (HippoRAG's corpus files have the same shape); id = position."""
    path = Path(path)
    passages = []
    for position, item in enumerate(_read_json_list(path, "corpus")):
        passages.append(Passage(title=_field(path, position, item, "title", str), text=_field(path, position, item, "text", str)))
    if not passages:
        raise HyperProveError(f"{path}: the corpus is empty")
    return passages


def _squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


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


def load_questions(path: str | Path, corpus: list[Passage] | None = None) -> list[Question]:
    """Questions in the project schema, or HippoRAG's native files (then `corpus` is needed)."""
    path = Path(path)
    items = _read_json_list(path, "questions")
    if not items:
        raise HyperProveError(f"{path}: the question list is empty")
    native = isinstance(items[0], dict) and ("paragraphs" in items[0] or "context" in items[0])
    if native and corpus is None:
        raise HyperProveError(f"{path}: HippoRAG-format questions need the corpus to locate gold passages")
    lookup = _PassageLookup(corpus) if native else None
    n_passages = len(corpus) if corpus is not None else None
    questions = [
        (_native_question(path, k, item, lookup) if native else _schema_question(path, k, item, n_passages))
        for k, item in enumerate(items)
    ]
    return questions


def _answer_text(path: Path, position: int, item: dict) -> str:
    answer = _field(path, position, item, "answer", (str, list))
    if isinstance(answer, list):
        if not answer or not all(isinstance(a, str) for a in answer):
            raise HyperProveError(f'{path}: item {position}: field "answer" must be a string or a list of strings')
        return answer[0]
    return answer


def _schema_question(path: Path, position: int, item, n_passages: int | None) -> Question:
    gold = _field(path, position, item, "gold_passages", list, required=False, default=[])
    for value in gold:
        if not isinstance(value, int) or isinstance(value, bool) or value < 0 or (n_passages is not None and value >= n_passages):
            raise HyperProveError(f'{path}: item {position}: field "gold_passages" holds {value!r}, not a corpus index')
    steps = []
    for k, step in enumerate(_field(path, position, item, "decomposition", list, required=False, default=[])):
        where = f"{position} decomposition[{k}]"
        passage = step.get("passage") if isinstance(step, dict) else None
        steps.append(Step(
            question=_field(path, where, step, "question", str),
            answer=_field(path, where, step, "answer", str),
            passage=passage if isinstance(passage, int) else None,
        ))
    aliases = _field(path, position, item, "answer_aliases", list, required=False, default=[])
    return Question(
        id=str(_field(path, position, item, "id", (str, int))),
        question=_field(path, position, item, "question", str),
        answer=_answer_text(path, position, item),
        answer_aliases=tuple(a for a in aliases if isinstance(a, str)),
        type=str(item.get("type", "")),
        gold_passages=tuple(gold),
        decomposition=tuple(steps),
    )


def _native_question(path: Path, position: int, item, lookup: _PassageLookup) -> Question:
    if "paragraphs" in item:  # MuSiQue
        paragraphs = _field(path, position, item, "paragraphs", list)
        gold = [
            lookup.find(path, position, p.get("title", ""), p.get("paragraph_text", ""))
            for p in paragraphs if isinstance(p, dict) and p.get("is_supporting")
        ]
        steps = tuple(
            Step(question=s.get("question", ""), answer=s.get("answer", ""), passage=None)
            for s in item.get("question_decomposition", []) if isinstance(s, dict)
        )
    else:  # 2WikiMultihopQA, HotpotQA
        context = {entry[0]: entry[1] for entry in _field(path, position, item, "context", list) if isinstance(entry, list) and len(entry) == 2}
        titles = dict.fromkeys(fact[0] for fact in _field(path, position, item, "supporting_facts", list))
        gold = [lookup.find(path, position, title, "".join(context.get(title, []))) for title in titles]
        steps = ()
    identifier = item.get("id", item.get("_id"))
    if identifier is None:
        raise HyperProveError(f'{path}: item {position}: field "id" (or "_id") is missing')
    aliases = item.get("answer_aliases", [])
    return Question(
        id=str(identifier),
        question=_field(path, position, item, "question", str),
        answer=_answer_text(path, position, item),
        answer_aliases=tuple(a for a in aliases if isinstance(a, str)),
        type=str(item.get("type", "")),
        gold_passages=tuple(dict.fromkeys(gold)),
        decomposition=steps,
    )
