"""The one configuration object: it flows from the command line or an experiment file into the
index build, the retriever and (later) the MLflow params. No module reads the environment."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from modules.errors import HyperProveError
from modules.retriever import RetrieverConfig
from pipeline.files import read_json

DEFAULT_EMBEDDER = "all-MiniLM-L6-v2"


@dataclass
class IndexConfig:
    """How a corpus becomes a hypergraph index (steps 1-3)."""

    extractor: str = "sentences"
    embedder: str = DEFAULT_EMBEDDER
    eta: float = 0.8  # step 2: synonym cosine threshold
    synonym_neighbors: int = 10  # nearest names examined per entity for synonyms
    exact_search_max: int = 50_000  # above this many vectors FAISS search is IVF, not exact
    batch_size: int = 64  # embedder batch size

    def __post_init__(self) -> None:
        if not 0.0 < self.eta <= 1.0:
            raise HyperProveError(f"index config: eta={self.eta!r} must lie in (0, 1]")
        if self.synonym_neighbors < 1 or self.exact_search_max < 1 or self.batch_size < 1:
            raise HyperProveError("index config: synonym_neighbors, exact_search_max and batch_size must be >= 1")


@dataclass
class HyperProveConfig:
    """Everything a run depends on: retriever hyperparameters, index settings, paths."""

    retriever: RetrieverConfig = field(default_factory=RetrieverConfig)
    index: IndexConfig = field(default_factory=IndexConfig)
    cache_dir: str = ".hyperprove/cache"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict, source: str = "config") -> "HyperProveConfig":
        known = {f.name for f in fields(cls)}
        for key in values:
            if key not in known:
                raise HyperProveError(f"{source}: unknown field {key!r} (known: {', '.join(sorted(known))})")
        try:
            retriever = RetrieverConfig.from_dict(values.get("retriever", {}))
            index_values = values.get("index", {})
            unknown = set(index_values) - {f.name for f in fields(IndexConfig)}
            if unknown:
                raise HyperProveError(f"{source}: unknown field index.{sorted(unknown)[0]}")
            index = IndexConfig(**index_values)
        except TypeError as error:
            raise HyperProveError(f"{source}: {error}") from None
        return cls(retriever=retriever, index=index, cache_dir=values.get("cache_dir", cls.cache_dir))

    @classmethod
    def from_file(cls, path: str | Path) -> "HyperProveConfig":
        values = read_json(path, "config")
        if not isinstance(values, dict):
            raise HyperProveError(f"{path}: a config file holds one JSON object")
        return cls.from_dict(values, source=str(path))

    def with_overrides(self, retriever: dict | None = None, index: dict | None = None, **top) -> "HyperProveConfig":
        """A copy with the given (non-None) fields replaced, e.g. from command-line flags."""
        values = self.to_dict()
        values["retriever"].update({k: v for k, v in (retriever or {}).items() if v is not None})
        values["index"].update({k: v for k, v in (index or {}).items() if v is not None})
        values.update({k: v for k, v in top.items() if v is not None})
        return self.from_dict(values)
