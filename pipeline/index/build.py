"""Corpus -> hypergraph index (steps 1-3), in memory: entity names, synonyms, the build.

`HypergraphIndex` holds everything retrieval needs; `pipeline.index.store` writes and reads it
(its on-disk format and the index cache), `pipeline.index.changes` adds and deletes passages,
`pipeline.index.commands` is what the `index` command runs.
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from dataclasses import asdict, dataclass, field
from functools import cached_property
from threading import Thread
from typing import Callable, Sequence

import numpy as np
import scipy.sparse as sp

from modules.errors import HyperProveError
from modules.facts import Fact, Passage
from modules.lm.checks import find_entities, subject_name
from modules.retrieval.hypergraph import Hypergraph, binary_csr, expand_synonyms
from modules.retrieval.lexical import LexicalIndex
from modules.retrieval.retriever import FactTable, HypergraphRetriever, RetrieverConfig
from modules.retrieval.vectors import COMPRESSED_MIN, CodedRows, VectorIndex
from pipeline.config import IndexConfig
from pipeline.index.extract import Extractor, make_extractor

SYNONYM_QUERY_CHUNK = 65_536
SYNONYM_NPROBE = 4  # IVF lists scanned per name: synonyms (cos > 0.8) are near-duplicates, in the same cell
MAX_NAME_WORDS = 32  # the longest span of a query looked up as an entity name
VECTOR_SETS = {"fact": "facts.faiss", "entity": "entities.faiss", "passage": "passages.faiss"}


# --- step 1: entity names ------------------------------------------------------------------------
def normalise_entity(name: str) -> str:
    """The key that makes "The Beatles", "the beatles" and "Beatles'" one node.

    Accents folded, lower-cased, a possessive 's and a leading article dropped, punctuation
    turned into spaces, whitespace collapsed.
    """
    text = unicodedata.normalize("NFKD", name)
    text = "".join(c for c in text if not unicodedata.combining(c)).lower()
    text = re.sub(r"['’]s\b", "", text)
    text = re.sub(r"[^\w\s]", " ", text)
    text = re.sub(r"^\s*(the|a|an)\s+", "", text)
    return " ".join(text.split())


def fact_embedding_text(fact: Fact, passage: Passage) -> str:
    """A fact is embedded with its passage's subject in front, so "It won in 1990" still says what."""
    return f"{subject_name(passage.title)}: {fact.text}"


def corpus_checksum(passages: Sequence[Passage], block: int = 10_000) -> str:
    """sha256 of the corpus as one compact JSON list of [title, text], hashed a block of passages
    at a time (the same bytes, never one string of the whole corpus)."""
    digest = hashlib.sha256(b"[")
    for start in range(0, len(passages), block):
        items = json.dumps([[p.title, p.text] for p in passages[start : start + block]], ensure_ascii=False, separators=(",", ":"))
        digest.update(("," if start else "").encode() + items[1:-1].encode())
    digest.update(b"]")
    return digest.hexdigest()


# --- step 2: synonyms ----------------------------------------------------------------------------
def synonym_matrix(
    entity_vectors: np.ndarray, eta: float, neighbors: int, exact_max: int, compressed_min: int = COMPRESSED_MIN
) -> tuple[sp.csr_matrix, VectorIndex]:
    """Symmetric 0/1 matrix of name pairs with cosine > eta, from k-nearest-neighbour search.

    Each name looks at its `neighbors` nearest names only; above `exact_max` names the search is
    IVF over a few lists, so the cost grows far slower than the M^2 of all pairs
    (`experiments/bench/scale.py`). Returns the entity index too, for reuse.
    """
    n = len(entity_vectors)
    index = VectorIndex.build(entity_vectors, exact_max=exact_max, compressed_min=compressed_min)
    rows, cols = [], []
    for start in range(0, n, SYNONYM_QUERY_CHUNK):
        stop = min(start + SYNONYM_QUERY_CHUNK, n)
        scores, ids = index.search(entity_vectors[start:stop], neighbors + 1, nprobe=SYNONYM_NPROBE)
        own = np.arange(start, stop)[:, None]
        keep = (scores > eta) & (ids >= 0) & (ids != own)
        rows.append(np.broadcast_to(own, ids.shape)[keep])
        cols.append(ids[keep])
    rows_all = np.concatenate(rows) if rows else np.zeros(0, dtype=np.int64)
    cols_all = np.concatenate(cols) if cols else np.zeros(0, dtype=np.int64)
    matrix = binary_csr(np.concatenate([rows_all, cols_all]), np.concatenate([cols_all, rows_all]), (n, n))
    return matrix, index


# --- the index -----------------------------------------------------------------------------------
@dataclass
class HypergraphIndex:
    """Everything retrieval needs, in memory: facts, entities, synonyms, vectors, FAISS indexes."""

    passages: list[Passage]
    fact_text: list[str]
    fact_passage: np.ndarray
    fact_entities: sp.csr_matrix  # raw A_i (before synonyms), N x M
    entity_names: list[str]
    synonyms: sp.csr_matrix  # M x M, symmetric
    fact_vectors: np.ndarray
    entity_vectors: np.ndarray
    passage_vectors: np.ndarray
    fact_index: VectorIndex
    entity_index: VectorIndex
    passage_index: VectorIndex
    info: dict = field(default_factory=dict)  # extractor, embedder, config, corpus checksum, generations
    passage_ids: np.ndarray | None = None  # stable ids (never reused); None: the positions
    surfaces: dict[tuple[int, int], str] = field(default_factory=dict)  # (fact, entity) -> the name the fact used, where not the entity's
    entity_keys: list[str] | None = None  # normalise_entity of each name, kept so that growing an index does not redo them all
    entity_order: np.ndarray | None = None  # per fact_entities entry: where its fact listed that entity (0, 1, ...); None: id order
    row_codes: dict[str, CodedRows] = field(default_factory=dict)  # by VECTOR_SETS name: codes of a set whose vectors stay on disk
    reading: Thread | None = field(default=None, repr=False, compare=False)  # a load's background read of the mapped codes

    def __post_init__(self) -> None:
        for name in VECTOR_SETS:  # what an IVF-PQ search ranks its candidates by
            getattr(self, f"{name}_index").rows = self.rows(name)
        if self.passage_ids is None:
            self.passage_ids = np.arange(len(self.passages), dtype=np.int64)
        if self.entity_keys is None:
            self.entity_keys = [normalise_entity(name) for name in self.entity_names]
        if self.entity_order is None:
            indptr = self.fact_entities.indptr
            self.entity_order = (np.arange(indptr[-1]) - np.repeat(indptr[:-1], np.diff(indptr))).astype(np.int32)

    def rows(self, name: str) -> np.ndarray | CodedRows:
        """What a query reads a set's rows from: its codes where it has them (its vectors are
        memory-mapped), else its vectors."""
        return self.row_codes.get(name, getattr(self, f"{name}_vectors"))

    @cached_property
    def hypergraph(self) -> Hypergraph:
        incidence = expand_synonyms(self.fact_entities, self.synonyms)
        return Hypergraph(incidence, self.fact_passage, len(self.passages))

    @property
    def fact_table(self) -> FactTable:
        return FactTable(
            text=self.fact_text,
            passage=self.fact_passage,
            passages=self.passages,
            vectors=self.rows("fact"),
            index=self.fact_index,
            entity_facts=self.entity_facts,
        )

    @cached_property
    def entity_facts(self) -> sp.csr_matrix:
        """A_i by entity: the facts that name each entity (synonyms not added)."""
        return self.fact_entities.T.tocsr()

    @classmethod
    def from_parts(cls, passages: list[Passage], fact_text: list[str], fact_passage, fact_entities: sp.csr_matrix,
                   entity_names: list[str], synonyms: sp.csr_matrix, vectors: dict[str, np.ndarray],
                   indexes: dict[str, VectorIndex], info: dict, passage_ids=None,
                   surfaces: dict[tuple[int, int], str] | None = None, entity_keys: list[str] | None = None,
                   entity_order: np.ndarray | None = None, row_codes: dict[str, CodedRows] | None = None,
                   reading: Thread | None = None) -> "HypergraphIndex":
        """From the arrays a build computes or a load reads; `vectors`, `indexes` and `row_codes`
        by VECTOR_SETS name."""
        return cls(
            passages=passages, fact_text=fact_text, fact_passage=np.asarray(fact_passage, dtype=np.int64),
            fact_entities=fact_entities, entity_names=entity_names, synonyms=synonyms,
            **{f"{name}_vectors": vectors[name] for name in VECTOR_SETS}, **{f"{name}_index": indexes[name] for name in VECTOR_SETS},
            info=info, passage_ids=None if passage_ids is None else np.asarray(passage_ids, dtype=np.int64), surfaces=surfaces or {},
            entity_keys=entity_keys, entity_order=entity_order, row_codes=row_codes or {}, reading=reading,
        )

    @property
    def generation(self) -> int:
        return self.info.get("generations", [{}])[-1].get("generation", 0)

    @property
    def next_passage_id(self) -> int:
        """The id the next added passage gets: one above every id ever given, those of deleted
        passages included, so that an id names one passage for the life of the index."""
        if "next_passage_id" in self.info:
            return int(self.info["next_passage_id"])
        removed = [int(i) for g in self.info.get("generations", []) for i, _ in g.get("removed_passages", [])]
        return max([-1, *self.passage_ids.tolist(), *removed]) + 1

    def retriever(self, config: RetrieverConfig, encode: Callable[[str], np.ndarray]) -> HypergraphRetriever:
        return HypergraphRetriever(self.hypergraph, self.fact_table, encode, config, name_entities=self.name_entities,
                                   lexical=self.lexical_scores)

    @cached_property
    def lexical(self) -> LexicalIndex:
        """BM25 over each fact read with its passage's title, built on first use (a retriever
        without `lexical_seeds` or `lexical_weight` never builds it)."""
        return LexicalIndex([f"{self.passages[p].title}\n{text}" for p, text in zip(self.fact_passage.tolist(), self.fact_text)])

    def lexical_scores(self, query: str) -> np.ndarray:
        """Every fact's BM25 score for `query` (`LexicalIndex.scores`)."""
        return self.lexical.scores(query)

    @cached_property
    def entity_ids(self) -> dict[str, int]:
        """Normalised entity name -> entity id."""
        return {key: k for k, key in enumerate(self.entity_keys)}

    @cached_property
    def longest_name(self) -> int:
        """Words in the longest normalised entity name: a longer span of a query names nothing."""
        return max((key.count(" ") + 1 for key in self.entity_keys if key), default=0)

    def name_entities(self, text: str) -> list[int]:
        """The entities of this index that a text names: the spans the `sentences` extractor's
        rules find (capitalised runs, dates, numbers), each matched by normalised name, longest
        first, word by word from the left, so that "Was the Steven Spielberg of Jaws" (one run in
        a question) names "Steven Spielberg" and "Jaws". A part starts with a capital or a digit.
        A part is at most `longest_name` words and two more (a leading article, a word such as
        "&" that normalises to nothing), and never more than MAX_NAME_WORDS: the work grows
        with the text's length, not with its square or cube (a 1,000-word capitalised run took
        minutes when every span of it was tried)."""
        most = min(self.longest_name + 2, MAX_NAME_WORDS)
        named = []
        for span in find_entities(text, ""):
            words, start = span.split(), 0
            while start < len(words):
                first = words[start][:1]
                ends = range(min(len(words), start + most), start, -1) if first.isupper() or first.isdigit() else ()
                match = next(((end, self.entity_ids[key]) for end in ends
                              if (key := normalise_entity(" ".join(words[start:end]))) and key in self.entity_ids), None)
                if match:
                    start = match[0]
                    named.append(match[1])
                else:
                    start += 1
        return named

    def counts(self) -> dict:
        return {
            "passages": len(self.passages),
            "facts": len(self.fact_text),
            "entities": len(self.entity_names),
            "synonym_pairs": int(self.synonyms.nnz // 2),
            "incidences": int(self.fact_entities.nnz),
        }


def assemble_index(
    passages: list[Passage],
    fact_text: list[str],
    fact_passage: np.ndarray,
    fact_entities: sp.csr_matrix,
    entity_names: list[str],
    vectors: dict[str, np.ndarray],
    config: IndexConfig,
    info: dict,
    surfaces: dict[tuple[int, int], str] | None = None,
    entity_keys: list[str] | None = None,
    entity_order: np.ndarray | None = None,
) -> HypergraphIndex:
    """Steps 2-3 on extracted, embedded facts: synonyms and the FAISS indexes."""
    synonyms, entity_index = synonym_matrix(vectors["entity"], config.eta, config.synonym_neighbors, config.exact_search_max,
                                            config.compressed_search_min)
    indexes = {"entity": entity_index, **{name: vector_index(vectors[name], config) for name in ("fact", "passage")}}
    info = {**info, "built_on": {name: len(vectors[name]) for name in VECTOR_SETS}}
    return HypergraphIndex.from_parts(passages, fact_text, fact_passage, fact_entities, entity_names, synonyms, vectors, indexes, info,
                                      surfaces=surfaces, entity_keys=entity_keys, entity_order=entity_order)


def vector_index(vectors: np.ndarray, config: IndexConfig) -> VectorIndex:
    """The FAISS index the config asks for at this many vectors (`VectorIndex.kind_for`)."""
    return VectorIndex.build(vectors, exact_max=config.exact_search_max, compressed_min=config.compressed_search_min)


def build_index(passages: list[Passage], config: IndexConfig, embedder, progress: bool = True, extractor: Extractor | None = None) -> HypergraphIndex:
    """Extract facts, embed facts and passages, then `index_of`.

    `extractor` is needed for the `lm` extractor (it carries the LM); `sentences` is made here.
    """
    extractor = checked_extractor(config, extractor)
    facts: list[Fact] = [fact for per_passage in extractor.extract(passages, progress=progress) for fact in per_passage]
    return index_of(passages, facts, embedded(facts, passages, passages, embedder, progress), config, embedder, extractor, progress)


def checked_extractor(config: IndexConfig, extractor: Extractor | None) -> Extractor:
    """`extractor`, or the one the config names when it asks no LM; it must be the config's."""
    extractor = extractor or make_extractor(config.extractor, rules=config.sentence_rules)
    if extractor.name != config.extractor:
        raise HyperProveError(f"index config names extractor {config.extractor!r} but {extractor.name!r} was given")
    return extractor


def index_of(passages: list[Passage], facts: list[Fact], vectors: dict[str, np.ndarray], config: IndexConfig, embedder,
             extractor: Extractor, progress: bool = True) -> HypergraphIndex:
    """The index of extracted, embedded facts (`vectors`: "fact" and "passage"): entities get
    global ids in the order facts name them, their names are embedded, then `assemble_index`."""
    entity_names: list[str] = []
    key_to_id: dict[str, int] = {}
    fact_entities, entity_order, surfaces = entity_incidence(facts, key_to_id, entity_names)
    vectors = {**vectors, "entity": embedder.encode(entity_names, progress="embed entities" if progress else None)}
    checksum = corpus_checksum(passages)
    info = {
        "extractor": extractor.report(),
        "embedder": {"id": embedder.id, "dim": int(vectors["fact"].shape[1]) if len(facts) else embedder.dim},
        "config": asdict(config),
        "corpus_sha256": checksum,
        "generations": [{"generation": 0, "added": len(passages), "facts": len(facts), "corpus_sha256": checksum}],
        "next_passage_id": len(passages),
    }
    return assemble_index(
        passages, [f.text for f in facts], np.array([f.passage for f in facts], dtype=np.int64),
        fact_entities, entity_names, vectors, config, info, surfaces, list(key_to_id), entity_order,
    )


def entity_incidence(facts: Sequence[Fact], key_to_id: dict[str, int], entity_names: list[str],
                     first_row: int = 0) -> tuple[sp.csr_matrix, np.ndarray, dict[tuple[int, int], str]]:
    """Step 1's entity nodes: A_i of each fact as entity ids, over the normalised names. A name
    not in `key_to_id` gets the next id and is appended to `entity_names` (both are updated; the
    keys of `key_to_id` stay in id order), so growing an index numbers new names as a build of
    the whole corpus would. Beside the 0/1 matrix: where each fact listed each of its entities
    (aligned with the matrix's entries), and the surface names facts used where not their
    entity's ({(first_row + row, entity): name}; an entity is named as it was first seen). Both
    let a deletion name and number entities as a build without the deleted facts would."""
    rows, cols, places, surfaces = [], [], [], {}
    keys: dict[str, str] = {}  # a name recurs across facts: normalised once
    for row, fact in enumerate(facts):
        seen: set[int] = set()
        for name in fact.entities:
            key = keys.get(name)
            if key is None:
                key = keys[name] = normalise_entity(name)
            if not key:
                continue
            if key not in key_to_id:
                key_to_id[key] = len(entity_names)
                entity_names.append(name)
            entity = key_to_id[key]
            if entity in seen:
                continue
            rows.append(row)
            cols.append(entity)
            places.append(len(seen))
            seen.add(entity)
            if name != entity_names[entity]:
                surfaces[(first_row + row, entity)] = name
    return (*listed_incidence(np.array(rows, dtype=np.int64), np.array(cols, dtype=np.int64), np.array(places, dtype=np.int64),
                              (len(facts), len(entity_names))), surfaces)


def listed_incidence(rows: np.ndarray, cols: np.ndarray, places: np.ndarray, shape: tuple[int, int]) -> tuple[sp.csr_matrix, np.ndarray]:
    """The 0/1 fact x entity matrix of (row, col) pairs (each once), and each entry's place in its
    fact's list, aligned with the matrix's sorted entries."""
    matrix = sp.csr_matrix((places.astype(np.float64) + 1.0, (rows, cols)), shape=shape)
    matrix.sort_indices()
    order = (matrix.data - 1.0).astype(np.int32)
    matrix.data[:] = 1.0
    return matrix, order


def embedded(facts: Sequence[Fact], passages: Sequence[Passage], corpus: Sequence[Passage], embedder, progress: bool) -> dict[str, np.ndarray]:
    """The vectors of facts (each with its passage's subject, from `corpus`) and of passages."""
    return {
        "fact": embedder.encode([fact_embedding_text(f, corpus[f.passage]) for f in facts], progress="embed facts" if progress else None),
        "passage": embedder.encode([p.titled_text for p in passages], progress="embed passages" if progress else None),
    }


def embed_new(facts: Sequence[Fact], names: Sequence[str], passages: Sequence[Passage], corpus: Sequence[Passage], embedder,
              progress: bool) -> dict[str, np.ndarray]:
    """`embedded`, and the vectors of new entity names."""
    return {**embedded(facts, passages, corpus, embedder, progress),
            "entity": embedder.encode(list(names), progress="embed entities" if progress else None)}
