"""The retriever's hyperparameters, and the type check every configuration section shares.

Plain dataclasses with no heavy imports: the command line reads a config (and prints `--help`)
without loading DSPy, FAISS or torch. `pipeline/config.py` holds the other sections; this one
lives in `modules/` because `HypergraphRetriever` takes it and `modules/` imports nothing above it.
"""

from __future__ import annotations

import typing
from dataclasses import asdict, dataclass, fields
from types import NoneType, UnionType

from modules.errors import HyperProveError


def _accepts(kind, value) -> bool:
    """Whether `value` (parsed JSON) is of the annotated type: bool is not an int, an int is a float."""
    if isinstance(kind, UnionType) or typing.get_origin(kind) is typing.Union:
        return any(_accepts(option, value) for option in typing.get_args(kind))
    if kind is NoneType:
        return value is None
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is str:
        return isinstance(value, str)
    if typing.get_origin(kind) is list:
        (item,) = typing.get_args(kind)
        return isinstance(value, list) and all(_accepts(item, element) for element in value)
    raise TypeError(f"config fields of type {kind!r} are not supported")


def _describe(kind) -> str:
    if isinstance(kind, UnionType) or typing.get_origin(kind) is typing.Union:
        return " or ".join(_describe(option) for option in typing.get_args(kind))
    if kind is NoneType:
        return "null"
    if typing.get_origin(kind) is list:
        return f"a list of {_describe(typing.get_args(kind)[0])}"
    return {bool: "true or false", int: "a whole number", float: "a number", str: "a string"}[kind]


def check_types(section, name: str) -> None:
    """Raise one line naming `name.field` when a field holds the wrong JSON type (`"0.5"` for a
    number, `true` for a count, 2.5 for a depth); whole numbers given for float fields become floats."""
    hints = typing.get_type_hints(type(section))
    for field in fields(section):
        kind, value = hints[field.name], getattr(section, field.name)
        if not _accepts(kind, value):
            raise HyperProveError(f"{name} config: {field.name}={value!r} must be {_describe(kind)}")
        if kind is float or (isinstance(kind, UnionType) and float in typing.get_args(kind)):
            if isinstance(value, int):
                setattr(section, field.name, float(value))
        elif typing.get_origin(kind) is list and typing.get_args(kind)[0] is float:
            setattr(section, field.name, [float(v) for v in value])


def short_repr(value, limit: int = 40) -> str:
    """repr of a config value cut to a line's worth (a number of 400 digits is still one line)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def check_ranges(section, name: str, ranges: dict[str, tuple]) -> None:
    """Raise one line naming `name.field` when a numeric field lies outside its [low, high]."""
    for field_name, (low, high) in ranges.items():
        value = getattr(section, field_name)
        if value is not None and not low <= value <= high:
            raise HyperProveError(f"{name} config: {field_name}={short_repr(value)} must lie in [{low}, {high}]")


@dataclass
class RetrieverConfig:
    """The hyperparameters of steps 6-9 (alpha, theta, L, K and the bounds of the search)."""

    alpha: float = 0.9  # step 9: weight of the dense cosine against struct (chosen on MuSiQue train)
    theta: float = 0.05  # step 8: keep transitions T*[i,j] > theta
    depth: int = 2  # step 8: L, breadth-first steps from the seeds
    top_k: int = 3  # step 9: K facts added to the frontier per hop
    n_seeds: int = 10  # step 6: dense entry facts per hop
    subgraph_bound: int = 600  # step 7: facts in the local subgraph G*_t
    walk_steps: int = 2  # step 7: random-walk steps that rank facts for G*_t
    push_epsilon: float = 1e-5  # step 7: smallest per-fact mass an entity or passage spreads
    entity_weight: float = 0.1  # step 9, added: score bonus of a fact naming an entity the query names (chosen on 2Wiki train)

    # What a recorded config without these fields ran with (records made before they existed).
    RECORDED_WITHOUT = {"entity_weight": 0.0}

    # The range of each field: a setting outside it cannot run (a negative K) or would run without
    # bound (walk_steps 10**7, depth 10**400); the upper ends lie far beyond any setting measured.
    RANGES = {"alpha": (0.0, 1.0), "theta": (0.0, 0.999999), "depth": (0, 10), "top_k": (1, 100), "n_seeds": (1, 1000),
              "subgraph_bound": (1, 100_000), "walk_steps": (0, 50), "push_epsilon": (0.0, 1.0), "entity_weight": (0.0, 1.0)}

    def __post_init__(self) -> None:
        check_types(self, "retriever")
        check_ranges(self, "retriever", self.RANGES)

    def out_of_range(self) -> list[str]:
        """The fields whose value lies outside RANGES (NaN lies outside every range)."""
        return [name for name, (low, high) in self.RANGES.items() if not low <= getattr(self, name) <= high]

    @classmethod
    def from_dict(cls, values: dict) -> "RetrieverConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise HyperProveError(f"retriever config: unknown field {unknown[0]!r} (known: {', '.join(sorted(known))})")
        return cls(**values)

    def to_dict(self) -> dict:
        return asdict(self)


class Tunable(typing.NamedTuple):
    """A retriever field a sweep can search: its table label, command-line flag and help."""

    label: str
    flag: str
    help: str


def tunable_type(name: str) -> type:
    """float or int: what a sweep suggests for this field (RetrieverConfig's annotation)."""
    return typing.get_type_hints(RetrieverConfig)[name]


# The one list the config, the sweep, the command line and the report read.
TUNABLES = {
    "alpha": Tunable("alpha", "--alpha", "weight of cosine against struct (step 9)"),
    "theta": Tunable("theta", "--theta", "transition threshold (step 8)"),
    "depth": Tunable("L", "--depth", "L, breadth-first steps (step 8)"),
    "top_k": Tunable("K", "--top-k", "K, facts per hop (step 9)"),
    "n_seeds": Tunable("seeds", "--seeds", "dense seed facts per hop (step 6)"),
    "subgraph_bound": Tunable("bound", "--subgraph-bound", "facts in the local subgraph (step 7)"),
    "entity_weight": Tunable("beta", "--entity-weight", "score bonus of facts naming an entity the query names (step 9)"),
}
