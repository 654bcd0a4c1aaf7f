"""The one configuration object: it flows from the command line or an experiment file into the
index build, the retriever, the LM, the program, the evaluation and the MLflow params. No module
reads the environment."""

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


@dataclass
class EvaluationConfig:
    """What `hyperprove evaluate` runs: which systems on which questions, and where results go."""

    questions: str | None = None  # questions JSON
    corpus: str | None = None  # corpus JSON the questions refer to
    index: str | None = None  # index directory (default: built once and cached)
    retrievers: list[str] = field(default_factory=lambda: ["dense"])
    decomposition: str = "gold"  # "gold" (MuSiQue's sub-questions, no LM) or "lm" (the full program)
    read: bool = False  # with the LM: every system's top 5 passages also go to the same reader
    limit: int | None = None  # the first N questions
    out: str | None = None  # results directory (default: .hyperprove/results/<questions>-<decomposition>-<time>)
    name: str = ""  # the title of the results table and of the MLflow run
    description: str = ""

    def __post_init__(self) -> None:
        if self.decomposition not in ("gold", "lm"):
            raise HyperProveError(f"evaluation config: decomposition={self.decomposition!r} must be 'gold' or 'lm'")
        if self.limit is not None and self.limit < 1:
            raise HyperProveError(f"evaluation config: limit={self.limit!r} must be >= 1")
        if isinstance(self.retrievers, str):
            self.retrievers = [name.strip() for name in self.retrievers.split(",") if name.strip()]


@dataclass
class TrackingConfig:
    """Where MLflow runs go: a SQLite store and an artifact folder under `.hyperprove` by default."""

    uri: str = "sqlite:///.hyperprove/mlflow.db"
    artifacts: str = ".hyperprove/mlartifacts"  # artifact root of experiments this project creates
    experiment: str = "hyperprove"
    enabled: bool = True


SWEEP_OBJECTIVES = ("recall@5", "recall@2", "f1", "em")


@dataclass
class SweepConfig:
    """What a sweep searches, how long, and where the study is stored."""

    trials: int = 30  # finished (complete or pruned) trials the study should reach
    objective: str = "recall@5"
    storage: str = "sqlite:///.hyperprove/optuna.db"
    study: str = "hyperprove"
    seed: int = 0
    chunk: int = 10  # questions per pruning step
    alpha: list[float] = field(default_factory=lambda: [0.0, 1.0])
    theta: list[float] = field(default_factory=lambda: [0.0, 0.5])
    depth: list[int] = field(default_factory=lambda: [1, 4])  # L
    top_k: list[int] = field(default_factory=lambda: [2, 12])  # K
    best_out: str | None = None  # experiment config to write with the best parameters

    def __post_init__(self) -> None:
        if self.objective not in SWEEP_OBJECTIVES:
            raise HyperProveError(f"sweep config: objective={self.objective!r} must be one of {', '.join(SWEEP_OBJECTIVES)}")
        if self.trials < 1 or self.chunk < 1:
            raise HyperProveError("sweep config: trials and chunk must be >= 1")
        for name in ("alpha", "theta", "depth", "top_k"):
            low_high = getattr(self, name)
            if len(low_high) != 2 or low_high[0] > low_high[1]:
                raise HyperProveError(f"sweep config: {name}={low_high!r} must be [low, high] with low <= high")


_SECTIONS = {
    "retriever": RetrieverConfig, "index": IndexConfig, "lm": LMConfig, "program": ProgramConfig,
    "evaluation": EvaluationConfig, "tracking": TrackingConfig, "sweep": SweepConfig,
}


@dataclass
class HyperProveConfig:
    """Everything a run depends on: retriever hyperparameters, index settings, LM, program, paths."""

    retriever: RetrieverConfig = field(default_factory=RetrieverConfig)
    index: IndexConfig = field(default_factory=IndexConfig)
    lm: LMConfig = field(default_factory=LMConfig)
    program: ProgramConfig = field(default_factory=ProgramConfig)
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    sweep: SweepConfig = field(default_factory=SweepConfig)
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
