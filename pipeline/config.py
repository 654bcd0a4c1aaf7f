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
TIE_BREAKS = {"recall@5": "recall@2", "recall@2": "recall@5", "f1": "em", "em": "f1"}
SWEPT = ("alpha", "theta", "depth", "top_k", "n_seeds", "subgraph_bound")  # retriever fields a sweep can search


@dataclass
class SweepConfig:
    """What a sweep searches, how long, and where the study is stored."""

    trials: int = 30  # finished (complete or pruned) trials the study should reach
    objective: str = "recall@5"
    break_ties: bool = True  # order trials that tie on the objective by its partner metric (TIE_BREAKS)
    storage: str = "sqlite:///.hyperprove/optuna.db"
    study: str = "hyperprove"
    seed: int = 0
    chunk: int = 10  # questions per pruning step
    alpha: list[float] = field(default_factory=lambda: [0.0, 1.0])
    theta: list[float] = field(default_factory=lambda: [0.0, 0.5])
    depth: list[int] = field(default_factory=lambda: [1, 4])  # L
    top_k: list[int] = field(default_factory=lambda: [2, 12])  # K
    n_seeds: list[int] | None = None  # also sweep the dense seeds per hop (step 6) in this range
    subgraph_bound: list[int] | None = None  # also sweep the local subgraph's size (step 7) in this range
    best_out: str | None = None  # experiment config to write with the best parameters
    validate: str | None = None  # held-out questions (e.g. dev) to score the best and the starting parameters on

    @property
    def tie_break(self) -> str | None:
        return TIE_BREAKS[self.objective] if self.break_ties else None

    def __post_init__(self) -> None:
        if self.objective not in SWEEP_OBJECTIVES:
            raise HyperProveError(f"sweep config: objective={self.objective!r} must be one of {', '.join(SWEEP_OBJECTIVES)}")
        if self.trials < 1 or self.chunk < 1:
            raise HyperProveError("sweep config: trials and chunk must be >= 1")
        for name in SWEPT:
            low_high = getattr(self, name)
            if low_high is None and name in ("n_seeds", "subgraph_bound"):
                continue
            if not isinstance(low_high, list) or len(low_high) != 2 or low_high[0] > low_high[1]:
                raise HyperProveError(f"sweep config: {name}={low_high!r} must be [low, high] with low <= high")


COMPILE_TARGETS = ("decompose", "rewrite", "program")
COMPILE_OPTIMIZERS = ("bootstrap", "mipro", "gepa")


@dataclass
class CompileConfig:
    """What `hyperprove compile` optimises, with which DSPy optimizer, on which questions."""

    questions: str | None = None  # training questions JSON
    corpus: str | None = None  # the corpus they refer to (indexed for the `program` target)
    target: str = "decompose"  # decompose | rewrite (supervised by gold decompositions) | program (answer F1)
    optimizer: str = "bootstrap"  # bootstrap (BootstrapFewShot) | mipro (MIPROv2) | gepa (GEPA)
    train: int = 20  # the first N examples to compile on
    val: int = 20  # the next N, scored before and after
    max_bootstrapped_demos: int = 2
    max_labeled_demos: int = 2  # gold examples as demonstrations (decompose, rewrite)
    threshold: float | None = None  # grade a bootstrapped trace must reach (default: the target's)
    auto: str = "light"  # MIPROv2 / GEPA budget
    budget: int | None = None  # instead of `auto`, a small fixed budget: GEPA's metric calls, MIPROv2's candidates and trials
    prompt_lm: str | None = None  # LiteLLM id proposing instructions (MIPROv2) or reflecting (GEPA); default: the LM
    seed: int = 0
    out: str | None = None  # compiled program JSON (default .hyperprove/programs/<target>-<optimizer>-<time>.json)

    def __post_init__(self) -> None:
        if self.target not in COMPILE_TARGETS:
            raise HyperProveError(f"compile config: target={self.target!r} must be one of {', '.join(COMPILE_TARGETS)}")
        if self.optimizer not in COMPILE_OPTIMIZERS:
            raise HyperProveError(f"compile config: optimizer={self.optimizer!r} must be one of {', '.join(COMPILE_OPTIMIZERS)}")
        if self.auto not in ("light", "medium", "heavy"):
            raise HyperProveError(f"compile config: auto={self.auto!r} must be light, medium or heavy")
        if self.budget is not None and self.budget < 1:
            raise HyperProveError(f"compile config: budget={self.budget!r} must be >= 1")
        if self.train < 1 or self.val < 0 or self.max_bootstrapped_demos < 0 or self.max_labeled_demos < 0:
            raise HyperProveError("compile config: train >= 1; val, max_bootstrapped_demos and max_labeled_demos >= 0")


_SECTIONS = {
    "retriever": RetrieverConfig, "index": IndexConfig, "lm": LMConfig, "program": ProgramConfig,
    "evaluation": EvaluationConfig, "tracking": TrackingConfig, "sweep": SweepConfig,
    "compile": CompileConfig,
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
    compile: CompileConfig = field(default_factory=CompileConfig)
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
