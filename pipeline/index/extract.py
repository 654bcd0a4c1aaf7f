"""Fact extraction (METHOD.md step 1) behind one interface: the LM-free `sentences` extractor,
the `lm` extractor, and `lm-entities` (the sentences as facts, the LM naming their entities).

An extractor turns passages into facts; everything downstream (entity normalisation,
synonyms, incidence) is shared, so both plug in through the same `Extractor` protocol.

The `sentences` extractor, rule by rule (deterministic, no model):
1. Sentences: split after . ! ? followed by whitespace and an upper-case letter, digit or quote,
   except after common abbreviations (Dr., St., U.S., Jan., ...) and single-letter initials.
2. Pronouns: a sentence that is not the passage's first and starts with He/She/It/They
   becomes "<title> ..." and with His/Her/Its/Their becomes "<title>'s ..."; the title is
   used without a trailing parenthetical ("Jaws (film)" -> "Jaws"). First sentences usually
   name their subject, and later sentence-initial pronouns mostly refer back to it.
3. Entities of a fact: the title when the (resolved) sentence mentions it; capitalised spans
   outside it (runs of capitalised words, joined by of/the/de/von/van/...; a lone sentence-initial
   function word such as "The" or "In" is not an entity); dates ("11 February 1929",
   "February 11, 1929", "June 1990"); years and numbers of two or more digits, with an era
   marker when one follows ("1929", "323 BC", "16,801", "3.5"). Single digits are left out: they join unrelated facts through hubs.
"""

from __future__ import annotations

import hashlib
import json
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Callable, Iterator, Protocol, Sequence

from modules.errors import HyperProveError
from modules.facts import Fact, Passage
from modules.lm.checks import (
    document_sentences,
    find_entities,
    mentioned,
    resolve_pronoun,
    split_sentences,
    subject_name,
)
from pipeline.config import EXTRACTORS, HyperProveConfig
from pipeline.files import atomic_write_json, clear_scratch, read_json
from pipeline.index.documents import SECTION_MARK
from pipeline.lm.cluster import WorkerPool, batches, ray_module
from pipeline.runtime import apply_library_defaults


class Extractor(Protocol):
    """Turns passages into facts; `name` and `version` go into the index manifest."""

    name: str
    version: str

    def extract(self, passages: Sequence[Passage], first_id: int = 0, progress: bool = False) -> list[list[Fact]]:
        """Facts of each passage in order; passage k gets corpus id first_id + k."""
        ...

    def report(self) -> dict:
        """What the manifest records about this extractor (name, version, model, fallbacks)."""
        ...


class SentenceExtractor:
    """Sentences as facts, entities by rule (see the module docstring); `rules` 1 splits a passage's
    text as one run of sentences, 2 line by line (`document_sentences`)."""

    name = "sentences"
    version = "1"

    def __init__(self, rules: int = 2):
        self.rules = rules

    def extract(self, passages: Sequence[Passage], first_id: int = 0, progress: bool = False) -> list[list[Fact]]:
        from tqdm import tqdm

        return [self.extract_passage(p, first_id + k) for k, p in enumerate(tqdm(passages, desc="extract", unit="passage", disable=not progress))]

    def extract_passage(self, passage: Passage, passage_id: int) -> list[Fact]:
        # with the line rules a document's passage ("Page › Section") has its page for subject
        subject = subject_name(passage.title if self.rules == 1 else passage.title.split(SECTION_MARK)[0])
        facts = []
        units = split_sentences(passage.text) if self.rules == 1 else document_sentences(passage.text)
        for position, sentence in enumerate(units):
            if position > 0:
                sentence, _ = resolve_pronoun(sentence, subject, contractions=self.rules == 1)
            facts.append(Fact(text=sentence, entities=tuple(find_entities(sentence, subject)), passage=passage_id))
        if not facts and passage.title.strip():
            facts.append(Fact(text=subject, entities=(subject,), passage=passage_id))
        return facts

    def report(self) -> dict:
        return {"name": self.name, "version": self.version, **({"rules": self.rules} if self.rules != 1 else {})}


class LMExtractor:
    """Step 1 by an LM (`modules.lm.predictors.FactExtractor`): one call per passage.

    - Cache: each passage's facts are written as JSON under its content hash, the extractor
      version and the LM id, as soon as they arrive; an interrupted build resumes where it stopped.
    - Concurrency: `threads` passages are in flight at once (the local server runs as many slots).
    - Malformed output is asked for once more past the LM cache; if it is still unusable the
      passage falls back to the `sentences` extractor. Fallbacks are counted, reported at the end
      and recorded in the index manifest; they are not cached, so a later build tries again.
    - A fact whose text mentions none of the listed entities gets the rule-based entities.
    """

    name = "lm"
    version = "1"

    def __init__(self, lm, lm_id: str, cache_dir: str | Path, threads: int = 1, remote: Callable | None = None):
        """`remote(passages)`, when given, asks the LM elsewhere (`RayPassages`): it yields
        (position, rows or None, retried) per passage as they finish; `lm` is then unused."""
        self.lm, self.lm_id, self.threads, self.remote = lm, lm_id, threads, remote
        self.module = self.make_module()
        self.cache_dir = extraction_cache(cache_dir, lm_id, self.name, self.version)
        clear_scratch(self.cache_dir, depth=2)  # passages a killed build was writing
        self.counts = {"passages": 0, "cached": 0, "extracted": 0, "retried": 0, "fallbacks": 0, "lm_seconds": 0.0}
        self.fallback_titles: list[str] = []

    @staticmethod
    def make_module():
        from modules.lm.predictors import FactExtractor

        return FactExtractor()

    @staticmethod
    def rows(passage: Passage, output) -> list[dict]:
        """What is cached for a passage: its facts, each with its entities."""
        return [{"text": f.text, "entities": f.entities} for f in output.facts]

    def _path(self, passage: Passage) -> Path:
        return extraction_path(self.cache_dir, passage)

    def _cached(self, passage: Passage) -> list[dict] | None:
        return cached_extraction(self._path(passage))

    def _ask(self, passage: Passage) -> tuple[list[dict] | None, bool]:
        return ask_rows(self.module, self.rows, self.lm, passage)

    def _ask_here(self, passages: Sequence[Passage]) -> Iterator[tuple[int, list[dict] | None, bool]]:
        """`threads` passages in flight at once against this process's LM."""
        with ThreadPoolExecutor(max_workers=self.threads) as pool:
            futures = {pool.submit(self._ask, passage): position for position, passage in enumerate(passages)}
            try:
                for future in as_completed(futures):
                    yield futures[future], *future.result()
            except BaseException:
                for future in futures:
                    future.cancel()  # finished passages are cached; the rest is redone next time
                raise

    def _facts(self, passage: Passage, passage_id: int, rows: list[dict]) -> list[Fact]:
        subject = subject_name(passage.title)
        facts = []
        for row in rows:
            entities = [e for e in row.get("entities", []) if isinstance(e, str) and e.strip()]
            facts.append(Fact(text=row["text"], entities=tuple(entities or find_entities(row["text"], subject)), passage=passage_id))
        return facts

    def extract(self, passages: Sequence[Passage], first_id: int = 0, progress: bool = False) -> list[list[Fact]]:
        from tqdm import tqdm

        rows: list[list[dict] | None] = [self._cached(p) for p in passages]
        todo = [k for k, r in enumerate(rows) if r is None]
        self.counts["passages"] += len(passages)
        self.counts["cached"] += len(passages) - len(todo)
        asked = self.remote or self._ask_here
        started = time.perf_counter()
        with tqdm(total=len(todo), desc=f"extract ({self.name})", unit="passage", disable=not progress or not todo) as bar:
            try:
                for position, found, retried in asked([passages[k] for k in todo]):
                    k = todo[position]
                    if found is not None:  # kept at once: an interrupted build resumes after it
                        atomic_write_json(self._path(passages[k]), found)
                    rows[k] = found
                    self.counts["retried"] += retried
                    bar.update(1)
            finally:
                self.counts["lm_seconds"] = round(self.counts["lm_seconds"] + time.perf_counter() - started, 2)
        sentences = SentenceExtractor(rules=1)  # the fallback of records made before the line rules: kept so
        facts = []
        for k, (passage, found) in enumerate(zip(passages, rows)):
            if found is None:
                self.counts["fallbacks"] += 1
                self.fallback_titles.append(passage.title)
                facts.append(sentences.extract_passage(passage, first_id + k))
            else:
                facts.append(self._facts(passage, first_id + k, found))
        self.counts["extracted"] += len(todo) - sum(rows[k] is None for k in todo)
        return facts

    def report(self) -> dict:
        return {"name": self.name, "version": self.version, "lm": self.lm_id, **self.counts}


class LMEntityExtractor(LMExtractor):
    """Step 1 with the work split: the facts are the passage's sentences, pronouns resolved by
    rule as in `sentences`, and the LM names the passage's entities (`modules.lm.predictors.EntityExtractor`);
    each sentence gets the named entities it mentions (the rule-based ones when it mentions none).
    The LM writes a list of names instead of restating the passage, less than half the tokens
    of `lm`; cache, concurrency, retry and fallback are `LMExtractor`'s."""

    name = "lm-entities"
    version = f"1-sentences{SentenceExtractor.version}"  # the cached rows are sentences too: a new rule set extracts again

    @staticmethod
    def make_module():
        from modules.lm.predictors import EntityExtractor

        return EntityExtractor()

    @staticmethod
    def rows(passage: Passage, output) -> list[dict]:
        sentences = SentenceExtractor(rules=1).extract_passage(passage, 0)  # the sentences its cached rows and records hold
        return [{"text": fact.text, "entities": mentioned(output.entities, fact.text)} for fact in sentences]


def ask_rows(module, rows: Callable, lm, passage: Passage) -> tuple[list[dict] | None, bool]:
    """A passage's rows from the LM (`rows(passage, output)`), or None after two malformed answers
    (the second asked past the LM cache); and whether it was asked twice."""
    import dspy
    from dspy.utils.exceptions import AdapterParseError

    from modules.lm.predictors import MalformedOutput

    for attempt in range(2):
        try:
            with dspy.context(lm=lm):
                output = module(title=passage.title, passage=passage.text, attempt=attempt)
        except (AdapterParseError, MalformedOutput, ValueError):
            continue
        return rows(passage, output), attempt > 0
    return None, True


class PassageWorker:
    """A Ray worker (`pipeline.lm.cluster`): an LM session of its own at its endpoint, extracting
    batches of passages with `lm.concurrency` of them in flight; it writes nothing."""

    def __init__(self, config: dict, make_runtime: Callable):
        apply_library_defaults()
        config = HyperProveConfig.from_dict(config)
        self.kind, self.threads = LM_EXTRACTORS[config.index.extractor], config.lm.concurrency
        self.module, self.lm = self.kind.make_module(), make_runtime(config).session.lm

    def extract(self, batch: list[tuple[int, Passage]]) -> list[tuple[int, list[dict] | None, bool]]:
        with ThreadPoolExecutor(max_workers=self.threads) as pool:
            found = pool.map(lambda item: ask_rows(self.module, self.kind.rows, self.lm, item[1]), batch)
            return [(position, *result) for (position, _), result in zip(batch, found)]


class RayPassages:
    """`LMExtractor.remote` on a Ray cluster: passages in batches over `PassageWorker`s, started
    for each extraction and let go at its end."""

    batch = 8  # passages per task

    def __init__(self, config, make_runtime: Callable, log: Callable[[str], None] = print):
        ray_module()  # the extra is missing: say so before any work
        self.config, self.make_runtime, self.log = config, make_runtime, log

    def __call__(self, passages: Sequence[Passage]) -> Iterator[tuple[int, list[dict] | None, bool]]:
        if not passages:
            return
        workers = WorkerPool(self.config, PassageWorker, self.make_runtime)
        try:
            ready = workers.wait_ready()
            started = time.perf_counter()
            numbered = list(enumerate(passages))
            for finished in workers.stream(lambda worker, batch: worker.extract.remote(batch), batches(numbered, self.batch), "extraction"):
                yield from finished
            seconds = time.perf_counter() - started
            self.log(f"extraction: {len(passages)} passages in {seconds:.1f} s on {workers.workers} Ray workers "
                     f"({60 * len(passages) / seconds:.1f} passages/min; the workers were ready after {ready:.1f} s)")
        finally:
            workers.close()


# --- the extraction cache, and LM-extracted facts shipped as a file -----------------------------------------
def extraction_cache(cache_dir: str | Path, lm_id: str, name: str = LMExtractor.name, version: str = LMExtractor.version) -> Path:
    """Where an LM extractor keeps each passage's facts: one folder per extractor, version and LM."""
    key = hashlib.sha256(f"{name}-{version}-{lm_id}".encode()).hexdigest()[:16]
    return Path(cache_dir) / "extractions" / key


def passage_digest(passage: Passage) -> str:
    return hashlib.sha256(passage.titled_text.encode()).hexdigest()


def extraction_path(cache: Path, passage: Passage) -> Path:
    digest = passage_digest(passage)
    return cache / digest[:2] / f"{digest}.json"


def valid_rows(rows) -> bool:
    return isinstance(rows, list) and all(isinstance(r, dict) and isinstance(r.get("text"), str) for r in rows)


def cached_extraction(path: Path) -> list[dict] | None:
    try:
        rows = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):
        return None  # absent, or damaged by a crash outside the atomic write: extract again
    return rows if valid_rows(rows) else None


FACTS_FORMAT = "hyperprove-lm-facts"


def write_extracted_facts(path: str | Path, passages: Sequence[Passage], cache_dir: str | Path, lm_id: str) -> dict:
    """One JSON file with what the LM extracted for each of `passages` (all must be in the
    extraction cache), tied to each passage's checksum, the extractor version and the LM."""
    cache = extraction_cache(cache_dir, lm_id)
    rows = []
    for passage in passages:
        facts = cached_extraction(extraction_path(cache, passage))
        if facts is None:
            raise HyperProveError(f"passage {passage.title!r} has no LM extraction in {cache} (it fell back to sentences); extract it again")
        rows.append({"title": passage.title, "sha256": passage_digest(passage), "facts": facts})
    shipped = {"format": FACTS_FORMAT, "extractor_version": LMExtractor.version, "lm": lm_id, "passages": rows}
    atomic_write_json(path, shipped)
    return shipped


def read_extracted_facts(path: str | Path) -> dict:
    """A file from `write_extracted_facts`, checked (one line naming the problem if it is not one)."""

    shipped = read_json(path, "extracted facts")
    if not isinstance(shipped, dict) or shipped.get("format") != FACTS_FORMAT:
        raise HyperProveError(f"{path}: not a file of LM-extracted facts (format {FACTS_FORMAT!r})")
    for k, row in enumerate(shipped.get("passages") or []):
        if not (isinstance(row, dict) and isinstance(row.get("sha256"), str) and valid_rows(row.get("facts"))):
            raise HyperProveError(f"{path}: passages[{k}] needs sha256 and facts (a list of {{text, entities}})")
    return shipped


def seed_extracted_facts(path: str | Path, passages: Sequence[Passage], cache_dir: str | Path, lm_id: str) -> int:
    """Put shipped facts into the extraction cache where it has none, for the passages they were
    made from, when the same LM and extractor version made them (else nothing); returns how many."""
    shipped = read_extracted_facts(path)
    if shipped.get("lm") != lm_id or shipped.get("extractor_version") != LMExtractor.version:
        return 0
    by_digest = {row["sha256"]: row["facts"] for row in shipped["passages"]}
    cache, seeded = extraction_cache(cache_dir, lm_id), 0
    for passage in passages:
        target = extraction_path(cache, passage)
        facts = by_digest.get(passage_digest(passage))
        if facts is not None and cached_extraction(target) is None:
            atomic_write_json(target, facts)
            seeded += 1
    return seeded


LM_EXTRACTORS = {extractor.name: extractor for extractor in (LMExtractor, LMEntityExtractor)}
EXTRACTOR_VERSIONS = {"sentences": SentenceExtractor.version, **{name: e.version for name, e in LM_EXTRACTORS.items()}}  # in index cache keys


def make_extractor(name: str, lm=None, lm_id: str | None = None, cache_dir: str | Path = ".hyperprove/cache", threads: int = 1,
                   rules: int = 2) -> Extractor:
    """The named extractor (`pipeline.config.EXTRACTORS`); the LM ones need an LM (and its id,
    for the cache and the manifest); `rules` are the `sentences` extractor's (`IndexConfig.sentence_rules`)."""
    if name == "sentences":
        return SentenceExtractor(rules)
    if name in LM_EXTRACTORS:
        if lm is None or lm_id is None:
            raise HyperProveError(f"extractor {name!r} needs an LM (the local model, or --lm MODEL)")
        return LM_EXTRACTORS[name](lm, lm_id, cache_dir, threads)
    raise HyperProveError(f"unknown extractor {name!r} (available: {', '.join(EXTRACTORS)})")


def extractor_for(config, runtime, make_runtime: Callable | None = None) -> Extractor:
    """The extractor a `HyperProveConfig` names; an LM one takes the runtime's LM, started only now,
    or with `cluster.ray` asks Ray workers, each with `make_runtime(config)` (default `Runtime`)."""
    if config.index.extractor not in LM_EXTRACTORS:
        return make_extractor(config.index.extractor, rules=config.index.sentence_rules)
    if config.cluster.ray is not None:
        from pipeline.runtime import Runtime

        remote = RayPassages(config, make_runtime or Runtime)
        return LM_EXTRACTORS[config.index.extractor](None, runtime.lm_id, config.cache_dir, config.lm.concurrency, remote=remote)
    session = runtime.session
    return make_extractor(config.index.extractor, session.lm, session.id, config.cache_dir, config.lm.concurrency)


def describe_extraction(extractor: Extractor) -> list[str]:
    """What an LM extraction did, for the user: counts, fallbacks and throughput (nothing for rules)."""
    report = extractor.report()
    if report["name"] not in LM_EXTRACTORS:
        return []
    titles = extractor.fallback_titles
    lines = [
        f"{report['name']} extraction: {report['passages']} passages, {report['cached']} from the cache, {report['extracted']} extracted, "
        f"{report['retried']} retried, {report['fallbacks']} fell back to sentences"
        + (f" ({', '.join(titles[:5])}{', ...' if report['fallbacks'] > 5 else ''})" if report["fallbacks"] else "")
    ]
    asked = report["passages"] - report["cached"]
    if asked and report["lm_seconds"]:
        lines.append(f"{report['name']} extraction took {report['lm_seconds'] / 60:.1f} min: {60 * asked / report['lm_seconds']:.1f} passages per minute")
    return lines
