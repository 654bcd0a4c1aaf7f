"""Reading a corpus (a JSON list of {"title", "text"}; a passage's id is its position) and the
field checks every JSON input file shares: each problem is one line naming the file, the item
and the field."""

from __future__ import annotations

from pathlib import Path

from modules.errors import HyperProveError
from modules.facts import Passage
from pipeline.files import read_json


def read_json_list(path: Path, what: str) -> list:
    value = read_json(path, what)
    if not isinstance(value, list):
        raise HyperProveError(f"{path}: a {what} file holds a JSON list, found {type(value).__name__}")
    return value


def json_field(path: Path, position, item, name: str, kind: type | tuple, required: bool = True, default=None):
    """Field `name` of item `position`, checked to be of `kind` (bool is not an int); a string
    must be valid Unicode (JSON can carry a lone surrogate such as "\\ud800", which no text is)."""
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
    if isinstance(value, str):
        check_text(path, position, name, value)
    return value


def text_problem(value: str) -> str | None:
    """What makes a string no text (a lone surrogate, from JSON's "\\ud800" or bytes that are not
    UTF-8), or None."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as bad:
        return f"holds {value[bad.start]!r} at character {bad.start}, which is not text (a lone surrogate or a byte that is not UTF-8)"
    return None


def check_text(path: Path, position, name: str, text: str) -> None:
    if problem := text_problem(text):
        raise HyperProveError(f'{path}: item {position}: field "{name}" {problem}')


def corpus_passage(path: Path, position, item) -> Passage:
    """Item `position` of a corpus file as a passage, its fields checked."""
    return Passage(title=json_field(path, position, item, "title", str), text=json_field(path, position, item, "text", str))


def load_corpus(path: str | Path) -> list[Passage]:
    """A list of {"title", "text"} (HippoRAG's corpus files have the same shape); id = position.
    The same passage twice is refused: a question's gold passage would have two ids."""
    path = Path(path)
    passages, first_seen = [], {}
    for position, item in enumerate(read_json_list(path, "corpus")):
        passage = corpus_passage(path, position, item)
        earlier = first_seen.setdefault(passage, position)
        if earlier != position:
            raise HyperProveError(f"{path}: items {earlier} and {position} are the same passage (title and text); keep one")
        passages.append(passage)
    if not passages:
        raise HyperProveError(f"{path}: the corpus is empty")
    return passages
