"""The data model of METHOD.md step 1: passages, and facts as hyperedges over entities."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Passage:
    """A corpus passage; its id is its position in the corpus (titles are not unique). A passage
    read from a folder knows where it came from ("file#chunk"); that is not part of its identity."""

    title: str
    text: str
    source: str | None = field(default=None, compare=False)

    @property
    def titled_text(self) -> str:
        """"title\ntext": what passage embeddings, BM25 and cache keys all read."""
        return f"{self.title}\n{self.text}"


@dataclass(frozen=True)
class Fact:
    """Hyperedge h_i = (x_i, A_i, d_sigma(i)): text, entity surface names, source passage id."""

    text: str
    entities: tuple[str, ...]
    passage: int


@dataclass(frozen=True)
class ScoredFact:
    """A retrieved fact with the three numbers of step 9, kept for the evidence trace."""

    id: int
    text: str
    passage: int
    title: str
    cos: float
    struct: float
    score: float

    def to_dict(self) -> dict:
        return {
            "id": self.id,
            "text": self.text,
            "passage": self.passage,
            "title": self.title,
            "cos": round(self.cos, 6),
            "struct": round(self.struct, 6),
            "score": round(self.score, 6),
        }
