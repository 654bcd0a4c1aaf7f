"""The one configuration object: it flows from the command line or an experiment file into the
index build, the retriever, the LM, the program and (later) the MLflow params. No module reads
the environment."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from modules.errors import HyperProveError
from modules.retriever import RetrieverConfig
from pipeline.files import read_json
from pipeline.lm import LMConfig
from pipeline.program import ProgramConfig

DEFAULT_EMBEDDER = "all-MiniLM-L6-v2"


@dataclass
class IndexConfig:
    """How a corpus becomes a hypergraph index (steps 1-3)."""

    extractor: str = "sentences"  # "sentences" (rules) or "lm" (one LM call per passage)
    embedder: str = DEFAULT_EMBEDDER
    eta: float = 0.8  # step 2: synonym cosine threshold
    synonym_neighbors: int = 10  # nearest names examined per entity for synonyms
    exact_search_max: int = 50_000  # above this many vectors FAISS search is IVF, not exact
    batch_size: int = 64  # embedder batch size

    def __post_init__(self) -> None:
        if not 0.0 < self.eta <= 1.0:
            raise HyperProveError(f"index config: eta={self.eta!r} must lie in (0, 1]")
        if self.extractor not in ("sentences", "lm"):
            raise HyperProveError(f"index config: extractor={self.extractor!r} must be 'sentences' or 'lm'")
        if self.synonym_neighbors < 1 or self.exact_search_max < 1 or self.batch_size < 1:
            raise HyperProveError("index config: synonym_neighbors, exact_search_max and batch_size must be >= 1")


_SECTIONS = {"retriever": RetrieverConfig, "index": IndexConfig, "lm": LMConfig, "program": ProgramConfig}


@dataclass
class HyperProveConfig:
    """Everything a run depends on: retriever hyperparameters, index settings, LM, program, paths."""

    retriever: RetrieverConfig = field(default_factory=RetrieverConfig)
    index: IndexConfig = field(default_factory=IndexConfig)
    lm: LMConfig = field(default_factory=LMConfig)
    program: ProgramConfig = field(default_factory=ProgramConfig)
    cache_dir: str = ".hyperprove/cache"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict, source: str = "config") -> "HyperProveConfig":
        known = {f.name for f in fields(cls)}
        for key in values:
            if key not in known:
                raise HyperProveError(f"{source}: unknown field {key!r} (known: {', '.join(sorted(known))})")
        sections = {}
        for name, section in _SECTIONS.items():
            section_values = values.get(name, {})
            if not isinstance(section_values, dict):
                raise HyperProveError(f"{source}: {name} must be a JSON object")
            unknown = sorted(set(section_values) - {f.name for f in fields(section)})
            if unknown:
                raise HyperProveError(f"{source}: unknown field {name}.{unknown[0]}")
            try:
                sections[name] = section(**section_values)
            except TypeError as error:
                raise HyperProveError(f"{source}: {name}: {error}") from None
        return cls(**sections, cache_dir=values.get("cache_dir", cls.cache_dir))

    @classmethod
    def from_file(cls, path: str | Path) -> "HyperProveConfig":
        values = read_json(path, "config")
        if not isinstance(values, dict):
            raise HyperProveError(f"{path}: a config file holds one JSON object")
        return cls.from_dict(values, source=str(path))

    def with_overrides(self, **overrides) -> "HyperProveConfig":
        """A copy with the given (non-None) fields replaced, e.g. from command-line flags.

        A section takes a dict (`retriever={"alpha": 0.5}`), a top-level field a value.
        """
        values = self.to_dict()
        for name, value in overrides.items():
            if name in _SECTIONS:
                values[name].update({k: v for k, v in (value or {}).items() if v is not None})
            elif value is not None:
                values[name] = value
        return self.from_dict(values)
