"""The retriever's hyperparameters, and what every configuration section shares.

Each section is a pydantic dataclass: strict types (`"0.5"` is not a number, `true` is not a
count, 2.5 is not a depth), unknown fields refused, every number within its `Field` range, each
checked when the section is made or a field is set. The command line reads a config (and prints
`--help`) without loading DSPy, FAISS or torch. `pipeline/config.py` holds the other sections;
this one lives in `modules/` because `HypergraphRetriever` takes it and `modules/` imports nothing
above it.
"""

from __future__ import annotations

import functools
import typing
from dataclasses import asdict, fields
from types import NoneType, UnionType

from pydantic import ConfigDict, Field, ValidationError
from pydantic.dataclasses import dataclass

from modules.errors import HyperProveError

STRICT = ConfigDict(strict=True, extra="forbid", validate_assignment=True)


def short_repr(value, limit: int = 40) -> str:
    """repr of a config value cut to a line's worth (a number of 400 digits is still one line)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _kind(annotation) -> str:
    """What a field takes, in the words of a refusal: "a number", "a whole number or null", ..."""
    if isinstance(annotation, UnionType) or typing.get_origin(annotation) is typing.Union:
        return " or ".join(_kind(option) for option in typing.get_args(annotation))
    if typing.get_origin(annotation) is typing.Literal:
        options = [repr(option) for option in typing.get_args(annotation)]
        return " or ".join(options) if len(options) == 2 else "one of " + ", ".join(options)
    if typing.get_origin(annotation) is list:
        return f"a list of {_kind(typing.get_args(annotation)[0])}"
    return {NoneType: "null", bool: "true or false", int: "a whole number", float: "a number", str: "a string"}[annotation]


def _bounds(cls, name: str) -> tuple:
    """A field's [low, high] from its `Field(ge=..., le=...)`."""
    bounds = {side: getattr(rule, side) for rule in cls.__pydantic_fields__[name].metadata
              for side in ("ge", "le") if getattr(rule, side, None) is not None}
    return bounds.get("ge"), bounds.get("le")


def refusal(cls, section: str, error: ValidationError, given: dict) -> HyperProveError:
    """The first problem pydantic found, as one line naming `section.field`, its value and what
    it must be: "retriever config: alpha='0.5' must be a number"."""
    problem = error.errors()[0]
    name = str(problem["loc"][0]) if problem["loc"] else ""
    if problem["type"] in ("unexpected_keyword_argument", "extra_forbidden"):
        known = ", ".join(f.name for f in fields(cls))
        return HyperProveError(f"{section} config: unknown field {name!r} (known: {known})")
    value = given.get(name, problem.get("input"))
    if problem["type"] in ("greater_than_equal", "less_than_equal"):
        low, high = _bounds(cls, name)
        return HyperProveError(f"{section} config: {name}={short_repr(value)} must lie in [{low}, {high}]")
    if problem["type"] == "value_error":  # a field's own validator: its message says what is wrong
        return HyperProveError(f"{section} config: {str(problem['msg']).removeprefix('Value error, ')}")
    annotation = typing.get_type_hints(cls)[name]
    return HyperProveError(f"{section} config: {name}={short_repr(value)} must be {_kind(annotation)}")


def config_section(section: str):
    """A configuration section: a strict pydantic dataclass whose refusals are one
    HyperProveError line (`refusal`), on construction and on assignment alike."""

    def make(cls):
        cls = dataclass(config=STRICT)(cls)
        init, assign = cls.__init__, cls.__setattr__

        @functools.wraps(init)
        def __init__(self, *args, **values):
            try:
                init(self, *args, **values)
            except ValidationError as error:
                raise refusal(cls, section, error, values) from None

        def __setattr__(self, name, value):
            try:
                assign(self, name, value)
            except ValidationError as error:
                raise refusal(cls, section, error, {name: value}) from None

        cls.__init__, cls.__setattr__ = __init__, __setattr__
        return cls

    return make


@config_section("retriever")
class RetrieverConfig:
    """The hyperparameters of steps 6-9 (alpha, theta, L, K and the bounds of the search). The
    upper ends of the ranges lie far beyond any setting measured: past them a search would run
    without bound (walk_steps 10**7, depth 10**400)."""

    alpha: float = Field(0.9, ge=0.0, le=1.0)  # step 9: weight of the dense cosine against struct (chosen on MuSiQue train)
    theta: float = Field(0.05, ge=0.0, le=0.999999)  # step 8: keep transitions T*[i,j] > theta
    depth: int = Field(2, ge=0, le=10)  # step 8: L, breadth-first steps from the seeds
    top_k: int = Field(3, ge=1, le=100)  # step 9: K facts added to the frontier per hop
    n_seeds: int = Field(10, ge=1, le=1000)  # step 6: dense entry facts per hop
    subgraph_bound: int = Field(600, ge=1, le=100_000)  # step 7: facts in the local subgraph G*_t
    walk_steps: int = Field(2, ge=0, le=50)  # step 7: random-walk steps that rank facts for G*_t
    push_epsilon: float = Field(1e-5, ge=0.0, le=1.0)  # step 7: smallest per-fact mass an entity or passage spreads
    entity_weight: float = Field(0.1, ge=0.0, le=1.0)  # step 9, added: score bonus of a fact naming an entity the query names (chosen on 2Wiki train)
    entity_facts: int = Field(0, ge=0, le=20)  # step 9, added: also this many facts nearest the query among those naming an entity it names, wherever they lie
    lexical_seeds: int = Field(10, ge=0, le=1000)  # step 6, added: entry facts by BM25 over "title\ntext", beside the dense ones (chosen on train splits, experiments/FINDINGS.md)
    lexical_weight: float = Field(0.3, ge=0.0, le=1.0)  # step 9, added: weight of a candidate's BM25 score, as a share of the query's best fact's

    # What a recorded config without these fields ran with (records made before they existed).
    RECORDED_WITHOUT = {"entity_weight": 0.0, "entity_facts": 0, "lexical_seeds": 0, "lexical_weight": 0.0}

    @property
    def lexical(self) -> bool:
        """Whether the search reads BM25 (`lexical_seeds` or `lexical_weight`), and so needs the facts' scores."""
        return bool(self.lexical_seeds or self.lexical_weight)

    @classmethod
    def accepts(cls, name: str, value) -> bool:
        """Whether `name` may take `value` (its type and range)."""
        try:
            cls(**{name: value})
        except HyperProveError:
            return False
        return True

    @classmethod
    def from_dict(cls, values: dict) -> "RetrieverConfig":
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
    "entity_facts": Tunable("entity facts", "--entity-facts", "facts naming an entity the query names added per hop, wherever they lie (step 9)"),
    "lexical_seeds": Tunable("lexical seeds", "--lexical-seeds", "entry facts per hop by BM25 over the fact and its title, beside the dense ones (step 6)"),
    "lexical_weight": Tunable("lexical", "--lexical-weight", "weight of a fact's BM25 score, as a share of the best fact's, in the score (step 9)"),
}
