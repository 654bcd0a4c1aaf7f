"""The one configuration object: it flows from the command line or an experiment file into the
index build, the retriever, the LM, the program, the evaluation and the MLflow params. No module
reads the environment.

Every section is a strict pydantic dataclass (`modules.config.config_section`: types, ranges
and choices checked on construction and assignment, each refusal one line), and this module
imports nothing heavy, so reading a config or printing `hyperprove --help` loads neither DSPy
nor FAISS nor torch. The retriever's section lives in `modules/config.py`, beside the list of
tunable names.
"""

from __future__ import annotations

import os
import typing
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from pydantic import Field, field_validator

from modules.config import TUNABLES, RetrieverConfig, config_section
from modules.errors import HyperProveError
from pipeline.files import read_json
from pipeline.sharing import check_shared

DEFAULT_EMBEDDER = "all-MiniLM-L6-v2"
LOCAL_MODEL_NAME = "qwen2.5-coder-1.5b-instruct-q4_k_m"  # the embedded model (pipeline/lm/session.py serves it)
LOCAL_MODEL_ID = f"local/{LOCAL_MODEL_NAME}"


ADAPTERS = {  # how prompts are laid out -> what the CLI help says
    "chat": "DSPy's ChatAdapter: every request ends with a reminder of the output format",
    "lean": "the same format, with that reminder once in the system message, the prefix the server's prompt cache keeps",
    "prefilled": "DSPy's ChatAdapter prompts, the reply started with its first field's header and stopped where its fields end",
    "lean-prefilled": "both: the reminder in the system message, and the reply started and stopped for the model",
}


Adapter = typing.Literal[tuple(ADAPTERS)]


def replay_sources(replay: str | None) -> list[str]:
    """The records an `lm.replay` value names: comma-separated, a long run measured in parts."""
    return [source.strip() for source in (replay or "").split(",") if source.strip()]


@config_section("lm")
class LMConfig:
    """Which LM answers, and how it is called."""

    model: str | None = None  # a LiteLLM model id; None: the embedded local model
    temperature: float = Field(0.0, ge=0.0, le=2.0)
    max_tokens: int = Field(400, ge=16, le=32_768)
    threads: int = Field(0, ge=0, le=64)  # concurrent requests; 0: 1 for the local model, 8 for an API model
    # An OpenAI-compatible endpoint ("http://host:port/v1"): with `model`, that model's server;
    # without, the embedded model served by another process (`hyperprove serve-lm`). Several,
    # comma-separated, are spread over the workers of a Ray run; a single process uses the first.
    api_base: str | None = None
    local_model_dir: str = "~/.cache/hyperprove/models"  # where the 22 parts are joined once
    local_context: int = Field(8192, ge=1024, le=131_072)  # local model: context tokens of each slot
    local_cpu_threads: int = Field(0, ge=0, le=256)  # local model: compute threads (0: all cores)
    adapter: Adapter | None = None  # one of ADAPTERS; None: the model's default (`layout`)
    # A request with no reply within `timeout` seconds has failed (None: 300); a failed request is
    # sent again at most `retries` times (None: 8 for an API model or a served endpoint, rate limits
    # and restarts to ride out; 2 for the embedded model in this process). Neither is in a call's key.
    timeout: float | None = Field(None, gt=0, le=3600)
    retries: int | None = Field(None, ge=0, le=20)
    # Local model: every request computes its whole prompt (the server's prompt cache off), so the
    # same prompt gets the same answer; about three times the seconds a question (experiments/FINDINGS.md).
    deterministic: bool = False
    # Local model: each request starts from its fixed prefix's saved state (every message before
    # the last user message), so what ran before it cannot change its answer, and each step's
    # prefix stays cached (`pipeline.lm.prefix`).
    pin_prefixes: bool = False
    # A results folder (or its lm_calls.jsonl.gz) whose recorded calls answer this run's LM requests
    # (`pipeline.lm.record`); a request not in it stops the run, unless `live` sends it to the LM.
    replay: str | None = None
    live: bool = False
    # A list reply whose strings hold bare double quotes (`["What is the f"" prefix for?"]`) is split
    # where one string ends, not at every quote (`pipeline.lm.adapters.quoted_items`).
    quoted_lists: bool = True

    @field_validator("api_base")
    @classmethod
    def _urls(cls, value):
        """Each endpoint an http(s) URL: a typo fails here, not at the first LM call."""
        for url in (value or "").split(","):
            if url.strip() and not url.strip().startswith(("http://", "https://")):
                raise ValueError(f"api_base {url.strip()!r}: expected an http:// or https:// URL such as http://127.0.0.1:8080/v1")
        return value

    # What a recorded config without these fields ran with (records made before they existed).
    RECORDED_WITHOUT = {"adapter": "chat", "deterministic": False, "pin_prefixes": False, "replay": None, "live": False, "timeout": None, "retries": None,
                        "quoted_lists": False}

    @property
    def layout(self) -> str:
        """The adapter the configured LM gets (`layout_for`)."""
        return self.layout_for(embedded=self.model is None)

    def layout_for(self, embedded: bool) -> str:
        """The adapter named, else `lean-prefilled` for the embedded model (half the seconds a
        question on train, F1 within noise: README, "The answer path at half the cost") and
        DSPy's `chat` for any other LM, some of which refuse a begun reply."""
        return self.adapter or ("lean-prefilled" if embedded else "chat")

    @property
    def request_timeout(self) -> float:
        return self.timeout or 300.0

    @property
    def request_retries(self) -> int:
        """Retries of a failed request (`retries`, else the default for where the LM is)."""
        if self.retries is not None:
            return self.retries
        return 2 if self.model is None and not self.api_base else 8

    @property
    def give_up_seconds(self) -> float:
        """The longest a request can take to fail: every attempt timing out, plus the backoff
        between them (1, 2, 4, ... seconds, at most 60 each)."""
        retries = self.request_retries
        return (retries + 1) * self.request_timeout + sum(min(2 ** k, 60) for k in range(retries))

    @property
    def endpoints(self) -> list[str]:
        """The endpoints `api_base` names, in order (empty: none)."""
        return [url.strip() for url in (self.api_base or "").split(",") if url.strip()]

    @property
    def concurrency(self) -> int:
        """Requests in flight at once. The local model gets one: on 2 cores a second server slot
        made extraction slower, not faster (figures: experiments/FINDINGS.md)."""
        return self.threads or (1 if self.model is None else 8)

    @property
    def id(self) -> str:
        """The id recorded in caches, manifests and runs."""
        return self.model or LOCAL_MODEL_ID


EXTRACTORS = {  # step 1 -> what the CLI help says
    "sentences": "sentences as facts, entities by rule (no model)",
    "lm": "the LM writes each passage's facts and entities (one call per passage)",
    "lm-entities": "sentences as facts, the LM names the entities (one short call per passage)",
}
READER_EVIDENCE = {  # what the final reader (step 11) sees -> what the CLI help says
    "facts": "the answered sub-questions, then the facts of the carried frontier",
    "passages": "the answered sub-questions, then the program's top 5 passages",
    "passages-only": "the program's top 5 passages, as every peer's reader sees its own",
}

BRIDGE_REWRITES = {  # how step 5 fills a sub-question's "#k" -> what the CLI help says
    "lm": "the BridgeRewriter asks the LM for a standalone question (one call per sub-question with a reference)",
    "rule": "each #k is replaced by the resolved answer, no LM call",
}


@config_section("program")
class ProgramConfig:
    """How the program runs the hops and what its final reader sees."""

    max_hops: int = Field(4, ge=1, le=10)  # longer decompositions count as failed
    carry: typing.Literal["supporting", "top_k"] = "supporting"  # the hop reader's cited facts, or the top K
    compiled: str | None = None  # compiled program JSON (`hyperprove compile`); None: the built-in demonstrations
    # The answer path; the defaults were chosen on the train splits (experiments/FINDINGS.md).
    entity_retries: int = Field(2, ge=0, le=5)  # asks again when a decomposition drops or invents a named word of the question; 0: no check
    grounded_hops: bool = True  # a hop answer its evidence facts do not contain is asked again, then replaced by a span of the asked kind
    grounded_in: typing.Literal["cited", "evidence"] = "cited"  # "cited": the facts the hop reader cited; "evidence": any of the hop's facts will do
    question_channel: bool = True  # the ranking for the whole question is interleaved first with the hops' rankings
    reader_evidence: typing.Literal[tuple(READER_EVIDENCE)] = "facts"  # one of READER_EVIDENCE
    comparison_demos: bool = True  # Decompose also shows two comparisons and is asked to keep the question's names
    decompose_facts: int = Field(0, ge=0, le=20)  # the decomposer also reads this many top facts found for the whole question; 0: the question alone
    bridge_rewrite: typing.Literal[tuple(BRIDGE_REWRITES)] = "rule"  # one of BRIDGE_REWRITES: how a sub-question's "#k" become the resolved answers (step 5)
    choose_options: bool = True  # a final answer that is none of the options a question names is asked for again as a choice (every reader)
    compare_by_rule: bool = True  # comparison and same-country questions answered from the hop answers by rule (`modules.lm.question_types`), the reader only when a value does not parse
    country_names: bool = True  # with grounded_hops: a hop answer naming a country its facts name by another word ("Austria", "Austrian") counts as in them
    comparison_plans: bool = True  # comparison and same-country questions of a shape a rule reads get their sub-questions by rule, without the decomposer
    hop_passage_facts: int = Field(6, ge=0, le=20)  # the hop reader also reads up to this many more facts of the hop's top passage (its other sentences, in order); 0: the top K alone
    both_by_rule: bool = True  # with compare_by_rule: "Are both A and B ...?" answered from the hops' yes/no answers (`both_answer`)
    documentation_demos: bool = False  # a question about a software manual (`QuestionShape`) is shown documentation demonstrations in the decomposer
    documentation_hop_demos: bool = True  # with documentation_demos: the hop reader too

    # What a recorded config without these fields ran with (records made before they existed), so
    # that reproducing an old run reruns the old program whatever today's defaults are.
    RECORDED_WITHOUT = {"entity_retries": 0, "grounded_hops": False, "question_channel": False, "reader_evidence": "facts",
                        "comparison_demos": False, "bridge_rewrite": "lm", "grounded_in": "cited",
                        "choose_options": False, "compare_by_rule": False, "comparison_plans": False,
                        "country_names": False, "hop_passage_facts": 0, "both_by_rule": False, "documentation_demos": False,
                        "documentation_hop_demos": True}

    # Options retired when train runs showed no gain for them (experiments/FINDINGS.md): a config
    # may still name one off (every run recorded since it existed does), and one that has it on
    # reruns only on the commit named here, the last that had its code.
    RETIRED = {"fold_identities": False, "chain_checks": False, "hop_subject": False, "last_hop_answers": False, "option_hops": False}
    RETIRED_AT = {"fold_identities": "10ca878", "chain_checks": "10ca878", "hop_subject": "10ca878", "last_hop_answers": "10ca878",
                  "option_hops": "57b67b4"}


@config_section("index")
class IndexConfig:
    """How a corpus becomes a hypergraph index (steps 1-3)."""

    extractor: typing.Literal[tuple(EXTRACTORS)] = "sentences"  # one of EXTRACTORS
    embedder: str = DEFAULT_EMBEDDER
    eta: float = Field(0.8, ge=1e-6, le=1.0)  # step 2: synonym cosine threshold
    synonym_neighbors: int = Field(10, ge=1, le=1000)  # nearest names examined per entity for synonyms
    exact_search_max: int = Field(50_000, ge=1, le=10**9)  # above this many vectors FAISS search is IVF, not exact
    compressed_search_min: int = Field(2_000_000, ge=1, le=10**10)  # above this many, IVF over PQ codes, ranked again exactly
    batch_size: int = Field(64, ge=1, le=4096)  # embedder batch size
    # a folder is read, extracted and embedded this many files at a time, each batch checkpointed
    # as it finishes (memory holds one batch; a killed build resumes at its first unfinished one)
    batch_files: int = Field(256, ge=1, le=10**6)
    # a folder of documents: passages of at most this many words (the benchmarks' passages are
    # 44-80 words at the median, few over 120), and the words repeated where a paragraph is cut
    passage_words: int = Field(120, ge=10, le=10_000)
    passage_overlap: int = Field(20, ge=0, le=1000)
    # what a folder lets in: links (by default a folder is read only through its own files), and
    # budgets a file must keep to, or be skipped with one line
    follow_links: bool = False
    max_file_mb: float = Field(64, gt=0, le=10**6)
    max_pdf_pages: int = Field(2000, ge=1, le=10**7)
    max_pdf_text_mb: float = Field(32, gt=0, le=10**6)  # MB of page content a PDF may hold to interpret
    # the `sentences` extractor's rules: 1 splits a passage as one run of sentences; 2 line by line,
    # a code block whole, "For example:" with what it introduces, no fact under 3 words, "It’s" kept
    sentence_rules: int = Field(2, ge=1, le=2)

    # The fields that shape the index (batch_size and batch_files only pace the work): what the index cache is
    # keyed on, and what an index loaded for a run must have been built with.
    SHAPING = ("extractor", "embedder", "eta", "synonym_neighbors", "exact_search_max", "compressed_search_min", "sentence_rules")

    # What a recorded config without these fields ran with (records made before they existed).
    RECORDED_WITHOUT = {"sentence_rules": 1, "compressed_search_min": 2_000_000}

    def shaping(self) -> dict:
        return {name: getattr(self, name) for name in self.SHAPING}


@config_section("evaluation")
class EvaluationConfig:
    """What `hyperprove evaluate` runs: which systems on which questions, and where results go."""

    questions: str | None = None  # questions JSON
    corpus: str | None = None  # corpus JSON the questions refer to
    index: str | None = None  # index directory (default: built once and cached)
    retrievers: list[str] = Field(default_factory=lambda: ["dense"])
    decomposition: typing.Literal["gold", "lm"] = "gold"  # gold sub-questions (no LM), or the full program
    read: bool = True  # with the LM: every system's top 5 passages also go to the same reader (False: they only rank)
    limit: int | None = Field(None, ge=1, le=10**9)  # the first N questions (after `skip`)
    skip: int = Field(0, ge=0, le=10**9)  # leave out the first N questions: questions skip+1 .. skip+limit
    types: list[str] = Field(default_factory=list)  # only questions of these types (the data's `type`, after `skip`); empty: all

    def selected(self, questions: list) -> list:
        """The questions this run takes: after the first `skip`, those of `types` (all when none
        are named), at most `limit`."""
        kept = [q for q in questions[self.skip:] if not self.types or q.type in self.types]
        return kept[: self.limit]
    out: str | None = None  # results directory (default: .hyperprove/results/<questions>-<decomposition>-<time>)
    name: str = ""  # the title of the results table and of the MLflow run
    description: str = ""

    @field_validator("questions", "corpus", "index")
    @classmethod
    def _home(cls, value):
        """"~/docs" in an experiment file is the user's folder, as it is on the command line."""
        return os.path.expanduser(value) if value else value

    @field_validator("retrievers", "types", mode="before")
    @classmethod
    def _listed(cls, value):
        """"dense, ppr" from the command line is the list of both."""
        return [name.strip() for name in value.split(",") if name.strip()] if isinstance(value, str) else value


@config_section("tracking")
class TrackingConfig:
    """Where MLflow runs go: a SQLite store and an artifact folder under `.hyperprove` by default."""

    uri: str = "sqlite:///.hyperprove/mlflow.db"
    artifacts: str = ".hyperprove/mlartifacts"  # artifact root of experiments this project creates
    experiment: str = "hyperprove"
    enabled: bool = True
    traces: bool = True  # with the LM, one MLflow trace per question (ask, demo, evaluate)


SWEEP_OBJECTIVES = ("recall@5", "recall@2", "f1", "em")
TIE_BREAKS = {"recall@5": "recall@2", "recall@2": "recall@5", "f1": "em", "em": "f1"}


@config_section("sweep")
class SweepConfig:
    """What a sweep searches, how long, and where the study is stored."""

    trials: int = Field(30, ge=1, le=100_000)  # finished (complete or pruned) trials the study should reach
    objective: typing.Literal[SWEEP_OBJECTIVES] = "recall@5"
    break_ties: bool = True  # order trials that tie on the objective by its partner metric (TIE_BREAKS)
    storage: str = "sqlite:///.hyperprove/optuna.db"
    study: str = "hyperprove"
    seed: int = Field(0, ge=0, le=2**32 - 1)
    chunk: int = Field(10, ge=1, le=100_000)  # questions per pruning step
    alpha: list[float] = Field(default_factory=lambda: [0.0, 1.0])
    theta: list[float] = Field(default_factory=lambda: [0.0, 0.5])
    depth: list[int] = Field(default_factory=lambda: [1, 4])  # L
    top_k: list[int] = Field(default_factory=lambda: [2, 12])  # K
    n_seeds: list[int] | None = None  # also sweep the dense seeds per hop (step 6) in this range
    subgraph_bound: list[int] | None = None  # also sweep the local subgraph's size (step 7) in this range
    entity_weight: list[float] | None = None  # also sweep the named-entity bonus (step 9) in this range
    entity_facts: list[int] | None = None  # also sweep the facts naming a query's entity added per hop (step 9) in this range
    lexical_seeds: list[int] | None = None  # also sweep the BM25 entry facts per hop (step 6) in this range
    lexical_weight: list[float] | None = None  # also sweep the weight of a fact's BM25 score (step 9) in this range
    best_out: str | None = None  # experiment config to write with the best parameters
    validate: str | None = None  # held-out questions (e.g. dev) to score the best and the starting parameters on
    transfer_questions: str | None = None  # held-out questions over another corpus (does a setting carry over?)
    transfer_corpus: str | None = None  # the corpus transfer_questions refer to

    @property
    def tie_break(self) -> str | None:
        return TIE_BREAKS[self.objective] if self.break_ties else None

    @property
    def ranges(self) -> dict[str, list]:
        """The swept retriever fields and their [low, high]: alpha, theta, L and K always, the other
        `TUNABLES` when given a range."""
        return {name: getattr(self, name) for name in TUNABLES if getattr(self, name) is not None}

    def __post_init__(self) -> None:
        """What one field cannot say alone: the ranges are [low, high] within the retriever's, and
        the transfer questions come with their corpus."""
        if (self.transfer_questions is None) != (self.transfer_corpus is None):
            raise HyperProveError("sweep config: transfer_questions and transfer_corpus go together (questions over another corpus)")
        for name, low_high in self.ranges.items():
            if len(low_high) != 2 or low_high[0] > low_high[1]:
                raise HyperProveError(f"sweep config: {name}={low_high!r} must be [low, high] with low <= high")
            for end in low_high:  # caught here, not inside the first trial
                if not RetrieverConfig.accepts(name, end):
                    raise HyperProveError(f"sweep config: {name}={low_high!r} reaches {end!r}, outside the retriever's range for {name}")


COMPILE_TARGETS = ("decompose", "rewrite", "steps", "final", "program")
COMPILE_OPTIMIZERS = ("bootstrap", "mipro", "gepa", "similar")
CHOOSE = {  # which of its pooled examples a predictor compiled by `similar` shows (words for one with n shown)
    "call": "the {n} nearest to each call shown",
    "question": "the {n} nearest to the question asked shown, the same on each of its calls",
    "once": "{n} representatives shown to every call",
}


@config_section("compile")
class CompileConfig:
    """What `hyperprove compile` optimises, with which DSPy optimizer, on which questions."""

    questions: str | None = None  # training questions JSON
    corpus: str | None = None  # the corpus they refer to (indexed for the program, steps and final targets)
    target: typing.Literal[COMPILE_TARGETS] = "decompose"  # decompose | rewrite | steps: decompose and the hop reader (gold decompositions) | final: the final reader (gold passages) | program (answer F1; similar: its own right answers' calls)
    optimizer: typing.Literal[COMPILE_OPTIMIZERS] = "bootstrap"  # bootstrap (BootstrapFewShot) | mipro (MIPROv2) | gepa (GEPA) | similar (pooled examples chosen by similarity)
    skip: int = Field(0, ge=0, le=1_000_000)  # leave out the first N questions (kept for checking)
    train: int = Field(20, ge=1, le=1_000_000)  # the first N examples to compile on (similar: the first N questions pooled)
    val: int = Field(20, ge=0, le=1_000_000)  # the next N, scored before and after
    max_bootstrapped_demos: int = Field(2, ge=0, le=64)
    max_labeled_demos: int = Field(2, ge=0, le=64)  # gold examples as demonstrations (decompose, rewrite); similar: shown per call, at most 16
    threshold: float | None = Field(None, ge=0.0, le=1.0)  # grade a bootstrapped (or pooled) trace must reach (default: the target's)
    auto: typing.Literal["light", "medium", "heavy"] = "light"  # MIPROv2 / GEPA budget
    budget: int | None = Field(None, ge=1, le=1_000_000)  # instead of `auto`, a small fixed budget: GEPA's metric calls, MIPROv2's candidates and trials
    prompt_lm: str | None = None  # LiteLLM id proposing instructions (MIPROv2) or reflecting (GEPA); default: the LM
    seed: int = Field(0, ge=0, le=2**32 - 1)
    keep_builtin: bool = False  # the built-in demonstrations stay, ahead of the compiled ones
    choose: typing.Literal[tuple(CHOOSE)] = "call"  # similar: one of CHOOSE
    out: str | None = None  # compiled program JSON (default .hyperprove/programs/<target>-<optimizer>-<time>.json)


@config_section("cluster")
class ClusterConfig:
    """Where the LM work of `index` (extraction) and `evaluate` (the questions) runs: in this process,
    or on the workers of a Ray cluster. It changes how fast a run goes, never what it computes."""

    ray: str | None = None  # a Ray cluster address ("auto": the one `ray start` runs here), or "local": one started in this process
    workers: int = Field(0, ge=0, le=4096)  # Ray workers (0: one per CPU of the cluster)


_SECTIONS = {
    "retriever": RetrieverConfig, "index": IndexConfig, "lm": LMConfig, "program": ProgramConfig,
    "evaluation": EvaluationConfig, "tracking": TrackingConfig, "sweep": SweepConfig,
    "compile": CompileConfig, "cluster": ClusterConfig,
}


def retired_on(section, values: dict) -> list[str]:
    """The retired options (`RETIRED`) that a section's values turn on."""
    return [option for option, off in getattr(section, "RETIRED", {}).items() if values.get(option, off) != off]


def without_retired(section, name: str, values: dict, source: str) -> dict:
    """A section's values without the retired options it names off (`RETIRED`); one it names on
    is refused with one line saying which commit reruns it."""
    if retired := retired_on(section, values):
        option = retired[0]
        raise HyperProveError(
            f"{source}: {name}.{option}={values[option]!r}: this option was retired (train runs showed no gain: "
            f"experiments/FINDINGS.md); the last commit with it, {section.RETIRED_AT[option]}, reruns this config "
            f"(git worktree add ../hyperprove-{section.RETIRED_AT[option]} {section.RETIRED_AT[option]})")
    return {key: value for key, value in values.items() if key not in getattr(section, "RETIRED", {})}


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
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
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
            section_values = without_retired(section, name, section_values, source)
            try:
                sections[name] = section(**section_values)
            except HyperProveError as error:
                raise HyperProveError(f"{source}: {error}") from None
        cache_dir = values.get("cache_dir", cls.cache_dir)
        if not isinstance(cache_dir, str):
            raise HyperProveError(f"{source}: cache_dir={cache_dir!r} must be a string")
        return cls(**sections, cache_dir=cache_dir)

    @classmethod
    def from_record(cls, values: dict, source: str = "record") -> "HyperProveConfig":
        """The config a run recorded: a field the record lacks (added since) takes the value the run
        went without it (`RECORDED_WITHOUT`), not today's default."""
        values = dict(values)
        for name, section in _SECTIONS.items():
            before = getattr(section, "RECORDED_WITHOUT", {})
            if before and isinstance(values.get(name, {}), dict):
                values[name] = {**before, **values.get(name, {})}
        return cls.from_dict(values, source)

    @classmethod
    def from_file(cls, path: str | Path, trusted: bool = False) -> "HyperProveConfig":
        """A config file, read as someone else's unless `trusted`: it may not choose where requests
        go or write outside the working folder (`pipeline.sharing`)."""

        values = read_json(path, "config")
        if not isinstance(values, dict):
            raise HyperProveError(f"{path}: a config file holds one JSON object")
        config = cls.from_dict(values, source=str(path))
        if not trusted:
            check_shared(values, cls().to_dict(), str(path))
        return config

    def with_overrides(self, source: str = "the command line", **overrides) -> "HyperProveConfig":
        """A copy with the given (non-None) fields replaced, e.g. from command-line flags.

        A section takes a dict (`retriever={"alpha": 0.5}`), a top-level field a value.
        """
        values = self.to_dict()
        for name, value in overrides.items():
            if name in _SECTIONS:
                values[name].update({k: v for k, v in (value or {}).items() if v is not None})
            elif value is not None:
                values[name] = value
        return self.from_dict(values, source)
