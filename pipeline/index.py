"""Corpus -> hypergraph index (steps 1-3), and its on-disk format.

On disk an index is a directory of open-format files behind `manifest.json` (format version,
embedder id and dimension, extractor, counts, corpus checksum and a sha256 per file). It is
written into a scratch directory and renamed into place, so a crash or Ctrl-C never leaves a
half-written index; loading checks every checksum and shape, and a damaged or mismatched index
fails with one line saying what is wrong.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
import unicodedata
from array import array
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Callable, Iterator, Sequence

import faiss
import numpy as np
import scipy.sparse as sp

from modules.errors import HyperProveError
from modules.facts import Fact, Passage
from modules.hypergraph import Hypergraph, binary_csr, expand_synonyms
from modules.retriever import FactTable, HypergraphRetriever, RetrieverConfig
from modules.vectors import VectorIndex
from pipeline.config import IndexConfig
from pipeline.extract import Extractor, find_entities, make_extractor, subject_name
from pipeline.files import (
    atomic_directory,
    atomic_save_npy,
    atomic_write_json,
    atomic_write_jsonl,
    check_replaceable,
    clear_scratch,
    read_json,
    read_npy,
    recover,
    sha256_files,
    writer_lock,
)

FORMAT = "hyperprove-index"
FORMAT_VERSION = 3  # 2: stable passage ids and surface names; 3: the manifest's own checksum and the next passage id
SYNONYM_QUERY_CHUNK = 65_536
SYNONYM_NPROBE = 4  # IVF lists scanned per name: synonyms (cos > 0.8) are near-duplicates, in the same cell
DAMAGED = "; the index is damaged, rebuild it"
MAX_NAME_WORDS = 32  # the longest span of a query looked up as an entity name
VECTOR_SETS = {"fact": "facts.faiss", "entity": "entities.faiss", "passage": "passages.faiss"}


def added_file(index_file: str) -> str:
    """The file of the vectors added to an IVF index since it was built (`VectorIndex.added`)."""
    return index_file.replace(".faiss", ".added.faiss")


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
    entity_vectors: np.ndarray, eta: float, neighbors: int, exact_max: int
) -> tuple[sp.csr_matrix, VectorIndex]:
    """Symmetric 0/1 matrix of name pairs with cosine > eta, from k-nearest-neighbour search.

    Each name looks at its `neighbors` nearest names only; above `exact_max` names the search is
    IVF over a few lists, so the cost grows far slower than the M^2 of all pairs (measured: 200k
    names in about 20 s on 2 cores). Returns the entity index too, for reuse.
    """
    n = len(entity_vectors)
    index = VectorIndex.build(entity_vectors, exact_max=exact_max)
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

    def __post_init__(self) -> None:
        if self.passage_ids is None:
            self.passage_ids = np.arange(len(self.passages), dtype=np.int64)
        if self.entity_keys is None:
            self.entity_keys = [normalise_entity(name) for name in self.entity_names]
        if self.entity_order is None:
            indptr = self.fact_entities.indptr
            self.entity_order = (np.arange(indptr[-1]) - np.repeat(indptr[:-1], np.diff(indptr))).astype(np.int32)

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
            vectors=self.fact_vectors,
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
                   entity_order: np.ndarray | None = None) -> "HypergraphIndex":
        """From the arrays a build computes or a load reads; `vectors` and `indexes` by VECTOR_SETS name."""
        return cls(
            passages=passages, fact_text=fact_text, fact_passage=np.asarray(fact_passage, dtype=np.int64),
            fact_entities=fact_entities, entity_names=entity_names, synonyms=synonyms,
            **{f"{name}_vectors": vectors[name] for name in VECTOR_SETS}, **{f"{name}_index": indexes[name] for name in VECTOR_SETS},
            info=info, passage_ids=None if passage_ids is None else np.asarray(passage_ids, dtype=np.int64), surfaces=surfaces or {},
            entity_keys=entity_keys, entity_order=entity_order,
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
        return HypergraphRetriever(self.hypergraph, self.fact_table, encode, config, name_entities=self.name_entities)

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
    synonyms, entity_index = synonym_matrix(vectors["entity"], config.eta, config.synonym_neighbors, config.exact_search_max)
    indexes = {"entity": entity_index, **{name: VectorIndex.build(vectors[name], exact_max=config.exact_search_max) for name in ("fact", "passage")}}
    info = {**info, "built_on": {name: len(vectors[name]) for name in VECTOR_SETS}}
    return HypergraphIndex.from_parts(passages, fact_text, fact_passage, fact_entities, entity_names, synonyms, vectors, indexes, info,
                                      surfaces=surfaces, entity_keys=entity_keys, entity_order=entity_order)


def build_index(passages: list[Passage], config: IndexConfig, embedder, progress: bool = True, extractor: Extractor | None = None) -> HypergraphIndex:
    """Extract facts, give entities global ids, embed facts/entities/passages, assemble.

    `extractor` is needed for the `lm` extractor (it carries the LM); `sentences` is made here.
    """
    extractor = extractor or make_extractor(config.extractor)
    if extractor.name != config.extractor:
        raise HyperProveError(f"index config names extractor {config.extractor!r} but {extractor.name!r} was given")
    facts: list[Fact] = [fact for per_passage in extractor.extract(passages, progress=progress) for fact in per_passage]
    entity_names: list[str] = []
    key_to_id: dict[str, int] = {}
    fact_entities, entity_order, surfaces = entity_incidence(facts, key_to_id, entity_names)
    vectors = embed_new(facts, entity_names, passages, passages, embedder, progress)
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


def embed_new(facts: Sequence[Fact], names: Sequence[str], passages: Sequence[Passage], corpus: Sequence[Passage], embedder,
              progress: bool) -> dict[str, np.ndarray]:
    """The vectors of new facts (with their passage's subject, from `corpus`), names and passages."""
    label = (lambda name: name) if progress else (lambda name: None)
    return {
        "fact": embedder.encode([fact_embedding_text(f, corpus[f.passage]) for f in facts], progress=label("embed facts")),
        "entity": embedder.encode(list(names), progress=label("embed entities")),
        "passage": embedder.encode([p.titled_text for p in passages], progress=label("embed passages")),
    }


def widened(matrix: sp.csr_matrix, shape: tuple[int, int]) -> sp.csr_matrix:
    """`matrix` with empty rows and columns appended up to `shape` (no copy of its entries)."""
    extra_rows = shape[0] - matrix.shape[0]
    indptr = np.concatenate([matrix.indptr, np.full(extra_rows, matrix.indptr[-1], dtype=matrix.indptr.dtype)])
    return sp.csr_matrix((matrix.data, matrix.indices, indptr), shape=shape)


def settle_vector_indexes(indexes: dict[str, VectorIndex], vectors: dict[str, np.ndarray], info: dict, config: IndexConfig) -> list[str]:
    """The retrain rule for indexes changed in place: an index is built again, as a fresh build
    would build it, when its size has crossed `exact_search_max` (exact <-> IVF) or, for IVF,
    when it holds more than twice or less than half the vectors its lists were trained on (the
    lists then no longer fit the data: twice the vectors per list at the same nprobe, or
    centroids of a distribution that has moved). Updates `indexes` and info["built_on"]; returns
    the names built again."""
    built_on = dict(info.get("built_on") or {name: len(indexes[name]) for name in VECTOR_SETS})
    rebuilt = []
    for name in VECTOR_SETS:
        size, trained = len(vectors[name]), built_on.get(name, len(vectors[name]))
        wanted = "exact" if size <= config.exact_search_max else "ivf"
        if indexes[name].kind != wanted or (wanted == "ivf" and not trained / 2 <= size <= 2 * trained):
            indexes[name] = VectorIndex.build(vectors[name], exact_max=config.exact_search_max)
            built_on[name] = size
            rebuilt.append(name)
    info["built_on"] = built_on
    return rebuilt


def grow_index(index: HypergraphIndex, added: list[Passage], config: IndexConfig, embedder, progress: bool = True,
               extractor: Extractor | None = None) -> HypergraphIndex:
    """The index with `added` appended as passages len(index.passages)...: only they are extracted
    and embedded, and only the new names (and the old names they find above eta) are searched
    for synonyms, against every name. Facts, entities and passages keep their ids; the FAISS
    indexes grow in place (an IVF index keeps the lists it was trained with, up to the retrain
    rule of `settle_vector_indexes`). On the same data a build of the whole corpus gives the same
    ids, vectors and incidence; see `grow_synonyms`. `index` is consumed: its FAISS indexes are
    the new one's."""
    extractor = extractor or make_extractor(config.extractor)
    if extractor.name != index.info["extractor"]["name"]:
        raise HyperProveError(f"the index was built with the {index.info['extractor']['name']!r} extractor; grow it with the same, not {extractor.name!r}")
    passages = index.passages + list(added)
    facts = [fact for per_passage in extractor.extract(added, first_id=len(index.passages), progress=progress) for fact in per_passage]
    names = list(index.entity_names)
    key_to_id = dict(index.entity_ids)  # a copy: the new names join it
    incidence, order, surfaces = entity_incidence(facts, key_to_id, names, first_row=len(index.fact_text))
    fact_entities = sp.vstack([widened(index.fact_entities, (index.fact_entities.shape[0], len(names))), incidence]).tocsr()
    fresh = embed_new(facts, names[len(index.entity_names):], added, passages, embedder, progress)
    vectors = {name: appended_rows(taken(index, f"{name}_vectors"), fresh[name]) for name in VECTOR_SETS}
    indexes = {name: getattr(index, f"{name}_index") for name in VECTOR_SETS}
    for name in VECTOR_SETS:
        indexes[name].add(fresh[name])
    info = dict(index.info)
    rebuilt = settle_vector_indexes(indexes, vectors, info, config)
    synonyms = grow_synonyms(index.synonyms, vectors["entity"], indexes["entity"], len(index.entity_names), config.eta, config.synonym_neighbors)
    first_id = index.next_passage_id
    checksum = corpus_checksum(passages)
    info.update(corpus_sha256=checksum, next_passage_id=first_id + len(added), generations=[*index.info["generations"], {
        "generation": index.generation + 1, "added": len(added), "facts": len(facts), "first_passage_id": first_id,
        "extractor": extractor.report(), "corpus_sha256": checksum, **({"rebuilt": rebuilt} if rebuilt else {})}])
    return HypergraphIndex.from_parts(passages, index.fact_text + [f.text for f in facts],
                                      np.concatenate([index.fact_passage, np.array([f.passage for f in facts], dtype=np.int64)]),
                                      fact_entities, names, synonyms, vectors, indexes, info,
                                      passage_ids=np.concatenate([index.passage_ids, first_id + np.arange(len(added))]),
                                      surfaces={**index.surfaces, **surfaces}, entity_keys=list(key_to_id),
                                      entity_order=np.concatenate([index.entity_order, order]))


def shrink_index(index: HypergraphIndex, removed: np.ndarray, config: IndexConfig, embedder) -> HypergraphIndex:
    """The index without the passages at positions `removed`, as a build of the passages left
    would give it: their facts leave every structure; an entity no fact names any more leaves
    with its synonym pairs; an entity whose name came from a removed fact takes the name its
    first remaining fact used (re-embedded: the only embedding done here). Entities are numbered
    again by their first remaining fact, as a build numbers them, so that even the order of
    floating-point sums is a build's. The synonym lists that can change are searched again
    (`shrink_synonyms`), the FAISS indexes shrink in place. Facts and passages keep their order
    (ids close up); passages keep their stable ids. `index` is consumed."""
    gone = np.zeros(len(index.passages), dtype=bool)
    gone[np.asarray(removed, dtype=np.int64)] = True
    fact_out = gone[index.fact_passage]
    kept_facts, fact_gone = np.flatnonzero(~fact_out), np.flatnonzero(fact_out)
    entries = index.fact_entities
    listed = sp.csr_matrix((index.entity_order + 1.0, entries.indices, entries.indptr), shape=entries.shape)[kept_facts]
    first_now, place = _first_rows(listed)
    survivors = np.flatnonzero(first_now >= 0)
    order = survivors[np.lexsort((place[survivors], first_now[survivors]))]  # old ids, as a build would number them
    entity_map = np.full(entries.shape[1], -1, dtype=np.int64)
    entity_map[order] = np.arange(len(order))
    renamed_names = _renamed(index, kept_facts, first_now)
    renamed = np.array(sorted(renamed_names), dtype=np.int64)
    fact_map = np.cumsum(~fact_out) - 1
    surfaces = {(int(fact_map[row]), int(entity_map[entity])): name
                for (row, entity), name in _rebased_surfaces(index, renamed_names).items() if not fact_out[row]}
    new_vectors = embedder.encode([renamed_names[e] for e in renamed]) if len(renamed) else np.zeros((0, index.entity_vectors.shape[1]), np.float32)
    vectors = {"fact": kept_rows(taken(index, "fact_vectors"), kept_facts), "passage": kept_rows(taken(index, "passage_vectors"), np.flatnonzero(~gone)),
               "entity": kept_rows(taken(index, "entity_vectors"), order)}
    vectors["entity"][entity_map[renamed]] = new_vectors
    indexes = {name: getattr(index, f"{name}_index") for name in VECTOR_SETS}
    indexes["fact"].remove(fact_gone)
    indexes["passage"].remove(np.flatnonzero(gone))
    indexes["entity"].renumber(entity_map)
    indexes["entity"].replace(entity_map[renamed], new_vectors)
    info = dict(index.info)
    rebuilt = settle_vector_indexes(indexes, vectors, info, config)
    synonyms = shrink_synonyms(index.synonyms, entity_map, renamed, vectors["entity"], indexes["entity"], config.eta, config.synonym_neighbors)
    fact_entities, entity_order = listed_incidence(np.repeat(np.arange(len(kept_facts)), np.diff(listed.indptr)), entity_map[listed.indices],
                                                   listed.data.astype(np.int64) - 1, (len(kept_facts), len(order)))
    passages = [p for p, out in zip(index.passages, gone) if not out]
    checksum = corpus_checksum(passages)
    info.update(corpus_sha256=checksum, generations=[*index.info["generations"], {
        "generation": index.generation + 1, "removed": int(gone.sum()), "facts_removed": len(fact_gone),
        "entities_removed": entries.shape[1] - len(order), "renamed": len(renamed),
        "removed_passages": [[int(i), p.title] for i, p, out in zip(index.passage_ids, index.passages, gone) if out],
        "corpus_sha256": checksum, **({"rebuilt": rebuilt} if rebuilt else {})}])
    names = [renamed_names.get(e, index.entity_names[e]) for e in order.tolist()]
    return HypergraphIndex.from_parts(
        passages, [index.fact_text[k] for k in kept_facts], np.cumsum(~gone)[index.fact_passage[kept_facts]] - 1, fact_entities,
        names, synonyms, vectors, indexes, info, passage_ids=index.passage_ids[~gone], surfaces=surfaces,
        entity_keys=[index.entity_keys[e] for e in order.tolist()], entity_order=entity_order)


def _first_rows(incidence: sp.csr_matrix) -> tuple[np.ndarray, np.ndarray]:
    """Per entity (column), the first fact (row) naming it (-1 for none), and the matrix's value there."""
    csc = incidence.tocsc()
    csc.sort_indices()
    if not csc.nnz:
        return np.full(incidence.shape[1], -1, dtype=np.int64), np.zeros(incidence.shape[1])
    first = np.minimum(csc.indptr[:-1], csc.nnz - 1)
    named = np.diff(csc.indptr) > 0
    return np.where(named, csc.indices[first], -1).astype(np.int64), np.where(named, csc.data[first], 0.0)


def _renamed(index: HypergraphIndex, kept_facts: np.ndarray, first_now: np.ndarray) -> dict[int, str]:
    """Entities whose first fact leaves and whose first remaining fact (`first_now`, among
    `kept_facts`) calls them otherwise: their new name, by old id."""
    first_before, _ = _first_rows(index.fact_entities)
    moved = np.flatnonzero((first_now >= 0) & (kept_facts[np.maximum(first_now, 0)] != first_before))
    renamed = {}
    for entity in moved.tolist():
        name = index.surfaces.get((int(kept_facts[first_now[entity]]), entity), index.entity_names[entity])
        if name != index.entity_names[entity]:
            renamed[entity] = name
    return renamed


def _rebased_surfaces(index: HypergraphIndex, renamed: dict[int, str]) -> dict[tuple[int, int], str]:
    """The surface names facts used, relative to the new names of renamed entities (old ids)."""
    surfaces = dict(index.surfaces)
    if renamed:
        columns = index.fact_entities.tocsc()
        for entity, name in renamed.items():
            for row in columns.indices[columns.indptr[entity] : columns.indptr[entity + 1]].tolist():
                used = index.surfaces.get((row, entity), index.entity_names[entity])
                if used == name:
                    surfaces.pop((row, entity), None)
                else:
                    surfaces[(row, entity)] = used
    return surfaces


ROW_CHUNK = 65_536


def taken(index: HypergraphIndex, name: str) -> np.ndarray:
    """index.<name>, taken out of the index being changed (it is consumed), so that the array can
    change size in place without another owner seeing it."""
    array = getattr(index, name)
    setattr(index, name, None)
    return array


def resized(array: np.ndarray, rows: int) -> np.ndarray:
    """`array` with `rows` rows: in place (a realloc, which the OS serves by remapping pages, not
    by a second copy of a million vectors) where numpy owns the buffer and nothing else views it;
    a copy otherwise."""
    try:
        array.resize((rows, *array.shape[1:]), refcheck=False)
        return array
    except ValueError:  # a view, or memory numpy did not allocate
        out = np.zeros((rows, *array.shape[1:]), dtype=array.dtype)
        out[: min(rows, len(array))] = array[:rows]
        return out


def appended_rows(array: np.ndarray, rows: np.ndarray) -> np.ndarray:
    first = len(array)
    array = resized(np.asarray(array, dtype=np.float32), first + len(rows))
    array[first:] = rows
    return array


def kept_rows(array: np.ndarray, order: np.ndarray) -> np.ndarray:
    """array[order] in place, cut to len(order) rows, for rows that mostly keep their order and
    move to lower places: the kept rows of a deletion (ascending) or entities numbered again
    (a few move later). Rows bound for a higher place are set aside first; the others move in
    ascending order of place, so each is read before its place is written, and a run of
    consecutive rows moves as one slice (ROW_CHUNK rows at a time). No second copy of the array."""
    order = np.asarray(order, dtype=np.int64)
    shift = order - np.arange(len(order))
    later = np.flatnonzero(shift < 0)
    aside = array[order[later]]
    breaks = np.flatnonzero(np.diff(order) != 1) + 1
    for start, end in zip(np.concatenate([[0], breaks]).tolist(), np.concatenate([breaks, [len(order)]]).tolist()):
        if start == end or shift[start] <= 0:
            continue  # in place already, or set aside
        for offset in range(start, end, ROW_CHUNK):
            stop = min(offset + ROW_CHUNK, end)
            array[offset:stop] = array[offset + shift[start] : stop + shift[start]]
    array[later] = aside
    return resized(array, len(order))


def names_near(entity_index: VectorIndex, vectors: np.ndarray, eta: float) -> np.ndarray:
    """The names above eta from any of `vectors`: the only names whose synonym lists a name with
    one of these vectors can enter or leave."""
    return np.unique(entity_index.within(vectors, eta, nprobe=SYNONYM_NPROBE)[1]) if len(vectors) else np.zeros(0, dtype=np.int64)


def first_per_row(rows: np.ndarray, scores: np.ndarray, count: int) -> np.ndarray:
    """Positions of the `count` highest scores of each row (rows sorted): a nearest-neighbour
    list read off a range search, which holds every neighbour above the threshold."""
    order = np.lexsort((-scores, rows))
    starts = np.searchsorted(rows[order], rows[order], side="left")
    return order[np.arange(len(order)) - starts < count]


def shrink_synonyms(synonyms: sp.csr_matrix, new_ids: np.ndarray, renamed: np.ndarray, entity_vectors: np.ndarray,
                    entity_index: VectorIndex, eta: float, neighbors: int) -> sp.csr_matrix:
    """Step 2 after names left (`new_ids` -1; the others renumbered to new_ids) or changed their
    vectors (`renamed`, old ids), giving the pairs a full search of the names left gives. A name
    whose list held a leaving or changed name is paired with it, so the lists that can change are
    those of their partners, of the changed names, and of the names near their new vectors (no
    search over the names that leave); `refresh_synonyms` searches them again. `entity_vectors`
    and `entity_index` are those after the change, in the new numbering."""
    synonyms = synonyms.tocsr()
    partners = synonyms[np.concatenate([np.flatnonzero(new_ids < 0), renamed])].indices
    touched = np.concatenate([new_ids[partners][new_ids[partners] >= 0], new_ids[renamed],
                              names_near(entity_index, entity_vectors[new_ids[renamed]], eta)])
    pairs = synonyms.tocoo()
    rows, cols = new_ids[pairs.row], new_ids[pairs.col]
    both = (rows >= 0) & (cols >= 0)
    n = len(entity_vectors)
    return refresh_synonyms(binary_csr(rows[both], cols[both], (n, n)), entity_vectors, entity_index, touched, eta, neighbors)


def grow_synonyms(synonyms: sp.csr_matrix, entity_vectors: np.ndarray, entity_index: VectorIndex, first_new: int, eta: float,
                  neighbors: int) -> sp.csr_matrix:
    """Step 2 for new names, giving the pairs a build of the whole corpus gives. New names can
    change an old name's list only if one of them lies above eta from it (then it may enter the
    list and push a pair out): those old names and the new ones are the names `refresh_synonyms`
    searches again. One range search around the new names finds those old names and gives the
    new names' own lists (their nearest above eta), so only the old names are searched again."""
    n = len(entity_vectors)
    if first_new == n:
        return synonyms
    new = np.arange(first_new, n)
    rows, found, scores = entity_index.within(entity_vectors[new], eta, nprobe=SYNONYM_NPROBE)
    listed = first_per_row(rows, scores, neighbors + 1)  # as the search for a new name's neighbors + 1 nearest finds them
    return refresh_synonyms(synonyms, entity_vectors, entity_index, np.union1d(found, new), eta, neighbors,
                            searched=(new, new[rows[listed]], found[listed]))


def refresh_synonyms(synonyms: sp.csr_matrix, entity_vectors: np.ndarray, entity_index: VectorIndex, touched: np.ndarray, eta: float,
                     neighbors: int, searched: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> sp.csr_matrix:
    """Step 2 again where the names changed, giving the pairs a full search gives. A pair is two
    names one of which is among the other's `neighbors` nearest above eta. `touched` are the
    names whose lists may have changed (a name near them came or went); every other list is as
    it was, so a pair between two untouched names stays. The touched names and their old
    partners (whose lists may hold them) have their lists searched again, and their pairs come
    from those lists. `synonyms` is in the current numbering, with rows for every name.
    `searched` = (names, rows, cols): names whose lists are already known, as (row, col) pairs."""
    n = len(entity_vectors)
    old = widened(synonyms.tocsr(), (n, n))  # names appended since have empty rows and columns
    touched = np.unique(np.asarray(touched, dtype=np.int64))
    if not len(touched):
        return old
    known, known_rows, known_cols = searched or (np.zeros(0, dtype=np.int64),) * 3
    redone = np.setdiff1d(np.union1d(touched, old[touched].indices), known)
    scores, found = entity_index.search(entity_vectors[redone], neighbors + 1, nprobe=SYNONYM_NPROBE)
    keep = (scores > eta) & (found >= 0) & (found != redone[:, None])
    other = known_rows != known_cols
    rows = np.concatenate([np.broadcast_to(redone[:, None], found.shape)[keep], known_rows[other]])
    cols = np.concatenate([found[keep], known_cols[other]])
    kept = old.tocoo()
    stays = ~np.isin(kept.row, touched) & ~np.isin(kept.col, touched)
    all_rows = np.concatenate([kept.row[stays], rows, cols])
    all_cols = np.concatenate([kept.col[stays], cols, rows])
    return binary_csr(all_rows.astype(np.int64), all_cols.astype(np.int64), (n, n))


# --- on disk -------------------------------------------------------------------------------------
def _listed_files(directory: Path) -> set[str] | None:
    """The files a HyperProve index manifest in `directory` lists; None when there is no such manifest."""
    try:
        manifest = json.loads((directory / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or not isinstance(manifest.get("files"), dict):
        return None
    return set(manifest["files"])


def check_index_target(directory: str | Path) -> None:
    """Refuse, before any work, an --out that is a file or a folder holding anything but an
    earlier HyperProve index (its manifest and the files it lists): replacing it would lose them."""
    directory = Path(directory)
    listed = _listed_files(directory) if directory.is_dir() else None  # None also for a foreign manifest.json
    check_replaceable(directory, None if listed is None else {"manifest.json", *listed}, "a HyperProve index")


def manifest_checksum(manifest: dict) -> str:
    """sha256 of the manifest's fields but this one, as compact JSON with sorted keys: a hand edit
    of any field (a corpus checksum, a count, a file's sha256) no longer passes as written."""
    fields = {key: value for key, value in manifest.items() if key != "manifest_sha256"}
    return hashlib.sha256(json.dumps(fields, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode()).hexdigest()


def save_index(index: HypergraphIndex, directory: str | Path, replaces: int | None = None) -> Path:
    """Write atomically: the directory appears complete, or not at all. One writer at a time
    (`writer_lock`); `replaces`: the generation the directory must still hold when the new one
    is renamed into place (an update read it), else nothing is written."""
    directory = Path(directory)
    with writer_lock(directory):
        check_index_target(directory)
        _write_index(index, directory, replaces)
    return directory


def _write_index(index: HypergraphIndex, directory: Path, replaces: int | None) -> None:
    with atomic_directory(directory) as scratch:
        entity_ptr = index.fact_entities.indptr
        owner = np.repeat(np.arange(len(index.fact_text)), np.diff(entity_ptr))
        listed = index.fact_entities.indices[np.lexsort((index.entity_order, owner))]  # each fact's entities as it listed them
        atomic_write_jsonl(scratch / "passages.jsonl", ({"id": int(i), "title": p.title, "text": p.text}
                                                        for i, p in zip(index.passage_ids, index.passages)))
        surfaces: dict[int, list] = {}
        for (row, entity), name in sorted(index.surfaces.items()):
            surfaces.setdefault(row, []).append([entity, name])
        atomic_write_jsonl(scratch / "facts.jsonl", (
            {"text": text, "passage": int(passage), "entities": listed[entity_ptr[i] : entity_ptr[i + 1]].tolist(),
             **({"surfaces": surfaces[i]} if i in surfaces else {})}
            for i, (text, passage) in enumerate(zip(index.fact_text, index.fact_passage))
        ))
        atomic_write_json(scratch / "entities.json", index.entity_names)
        atomic_write_json(scratch / "entity_keys.json", index.entity_keys)
        upper = sp.triu(index.synonyms, k=1).tocoo()
        atomic_save_npy(scratch / "synonyms.npy", np.stack([upper.row, upper.col], axis=1).astype(np.int64))
        for name, index_file in VECTOR_SETS.items():
            atomic_save_npy(scratch / f"{name}_vectors.npy", getattr(index, f"{name}_vectors"))
            vector_index = getattr(index, f"{name}_index")
            faiss.write_index(vector_index.index, str(scratch / index_file))
            if vector_index.added is not None:
                faiss.write_index(vector_index.added, str(scratch / added_file(index_file)))
        files = sorted(p.name for p in scratch.iterdir())
        manifest = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            **index.info,
            "counts": index.counts(),
            "vector_search": {name: getattr(index, f"{name}_index").kind for name in VECTOR_SETS},
            "files": {name: {"sha256": digest, "bytes": (scratch / name).stat().st_size}
                      for name, digest in zip(files, sha256_files([scratch / name for name in files]))},
        }
        manifest["manifest_sha256"] = manifest_checksum(manifest)
        atomic_write_json(scratch / "manifest.json", manifest)
        if replaces is not None:
            now = read_manifest(directory)["generations"][-1]["generation"]
            if now != replaces:
                raise HyperProveError(f"{directory}: changed by another writer (generation {now}, this change was made on "
                                      f"generation {replaces}); nothing written, run the command again")


REQUIRED_FILES = {"passages.jsonl", "facts.jsonl", "entities.json", "entity_keys.json", "synonyms.npy",
                  *VECTOR_SETS.values(), *(f"{name}_vectors.npy" for name in VECTOR_SETS)}


def read_manifest(directory: str | Path) -> dict:
    """The manifest of the index in `directory`, checked to have every key loading reads."""
    directory = Path(directory)
    path = directory / "manifest.json"
    recover(directory)  # a writer killed between its two renames left the previous index aside
    if not directory.is_dir():
        raise HyperProveError(f"{directory}: no such index directory (build one with `hyperprove index`)")
    if not path.exists():
        raise HyperProveError(f"{path}: missing; {directory} is not a HyperProve index")
    manifest = read_json(path, "manifest", damaged_hint=DAMAGED)
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise HyperProveError(f"{path}: not a HyperProve index manifest")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise HyperProveError(
            f"{path}: format version {manifest.get('format_version')!r}, this HyperProve reads {FORMAT_VERSION}; rebuild the index"
        )
    if manifest.get("manifest_sha256") != manifest_checksum(manifest):
        raise HyperProveError(f"{path}: its fields do not match its manifest_sha256 (edited by hand?){DAMAGED}")
    shapes = {"files": dict, "counts": dict, "config": dict, "extractor": dict, "embedder": dict, "corpus_sha256": str,
              "generations": list, "next_passage_id": int}
    for key, kind in shapes.items():
        if not isinstance(manifest.get(key), kind) or isinstance(manifest.get(key), bool):
            raise HyperProveError(f"{path}: {key!r} is missing or not a {kind.__name__}{DAMAGED}")
    if not isinstance(manifest["extractor"].get("name"), str):
        raise HyperProveError(f"{path}: the extractor entry needs its name{DAMAGED}")
    if not manifest["generations"] or not all(isinstance(g, dict) and _whole(g.get("generation")) for g in manifest["generations"]):
        raise HyperProveError(f"{path}: 'generations' must list objects, each with its generation number{DAMAGED}")
    if "built_on" in manifest and not (isinstance(manifest["built_on"], dict) and all(map(_whole, manifest["built_on"].values()))):
        raise HyperProveError(f"{path}: 'built_on' must map each vector set to a count{DAMAGED}")
    if not all(map(_whole, manifest["counts"].values())) or manifest["next_passage_id"] < 0:
        raise HyperProveError(f"{path}: 'counts' must hold whole numbers and 'next_passage_id' one >= 0{DAMAGED}")
    for name, entry in manifest["files"].items():
        if not isinstance(entry, dict) or not isinstance(entry.get("sha256"), str) or not isinstance(entry.get("bytes"), int):
            raise HyperProveError(f"{path}: the entry of {name!r} needs its sha256 and bytes{DAMAGED}")
    embedder = manifest["embedder"]
    if not isinstance(embedder.get("id"), str) or not isinstance(embedder.get("dim"), int) or isinstance(embedder.get("dim"), bool):
        raise HyperProveError(f"{path}: the embedder entry needs its id and dim{DAMAGED}")
    missing = sorted(REQUIRED_FILES - set(manifest["files"]))
    if missing:
        raise HyperProveError(f"{path}: lists no {missing[0]}; rebuild the index")
    return manifest


def _text(value, what: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} is a {type(value).__name__}, not text")
    return value


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _jsonl_rows(path: Path, block: int = 10_000) -> Iterator:
    """Rows of a JSONL file, a block of lines parsed at a time as one JSON list (twice as fast as
    a parse per line; a million facts are never all dicts at once). Lines end at b"\n" only:
    str.splitlines() would also split inside a text at U+2028, U+2029 or U+0085, which
    json.dumps(ensure_ascii=False) writes as they are."""
    with open(path, "rb") as handle:
        first = 1
        while lines := list(itertools.islice(handle, block)):
            try:
                rows = json.loads(b"[" + b",".join(lines) + b"]")
            except json.JSONDecodeError:
                rows = None
            if rows is None or len(rows) != len(lines):  # a bad line (or one holding two values): name it
                for number, line in enumerate(lines, start=first):
                    try:
                        json.loads(line)
                    except json.JSONDecodeError:
                        raise HyperProveError(f"{path}: line {number} is not valid JSON{DAMAGED}") from None
            yield from rows
            first += len(lines)


def check_built_with(manifest: dict, directory: Path, expect: IndexConfig) -> None:
    """The index was built with the settings asked for: a run then records what it really used."""
    built = manifest["config"]
    for name, wanted in expect.shaping().items():
        if name in built and built[name] != wanted:
            raise HyperProveError(f"{directory}: built with {name} {built[name]!r}, but {name} {wanted!r} was asked for; "
                                  f"ask for {built[name]!r} (--{name.replace('_', '-')} or index.{name} in the config) or rebuild the index")


def load_index(directory: str | Path, expect_embedder: str | None = None, verify: bool = True,
               expect: IndexConfig | None = None) -> HypergraphIndex:
    """Load and check an index; any damage or mismatch is a one-line HyperProveError. `expect`
    checks every setting that shapes the index, `expect_embedder` the embedder alone."""
    directory = Path(directory)
    manifest = read_manifest(directory)
    for name in manifest["files"]:
        if not (directory / name).exists():
            raise HyperProveError(f"{directory / name}: missing from the index; rebuild it")
    if verify:
        digests = sha256_files([directory / name for name in manifest["files"]])
        for (name, entry), digest in zip(manifest["files"].items(), digests):
            if digest != entry["sha256"]:
                raise HyperProveError(f"{directory / name}: checksum mismatch, the index is damaged; rebuild it")
    embedder = manifest["embedder"]["id"]
    if expect_embedder is not None and embedder != expect_embedder:
        raise HyperProveError(f"{directory}: built with embedder {embedder!r}, but {expect_embedder!r} was asked for")
    if expect is not None:
        check_built_with(manifest, directory, expect)
    try:
        index = _read_index(directory, manifest)
    except (ValueError, KeyError, TypeError, IndexError, OSError, EOFError, RuntimeError, RecursionError) as error:
        # A file that passed its checksum yet does not parse (written by hand, or truncated and re-summed).
        raise HyperProveError(f"{directory}: cannot be read ({type(error).__name__}: {str(error)[:120]}){DAMAGED}") from None
    if index.counts() != manifest.get("counts"):
        raise HyperProveError(f"{directory}/manifest.json: counts do not match the files; rebuild the index")
    if corpus_checksum(index.passages) != manifest["corpus_sha256"]:
        raise HyperProveError(f"{directory}/manifest.json: its corpus_sha256 is not the checksum of the passages in passages.jsonl{DAMAGED}")
    return index


def check_vectors(directory: Path, name: str, vectors: np.ndarray, dim: int, count: int, block: int = 65_536) -> None:
    """float32 rows of `dim`, finite and of unit norm (or all zero: a text with no words), a
    block of rows at a time: what search and the scores of step 9 assume of every vector."""
    if vectors.dtype != np.float32 or vectors.shape != (count, dim):
        raise HyperProveError(f"{directory}: {name} vectors are {vectors.dtype} of shape {vectors.shape}, not float32 of "
                              f"({count}, {dim}) as the manifest counts say{DAMAGED}")
    for start in range(0, count, block):
        rows = vectors[start : start + block]
        norms = np.einsum("ij,ij->i", rows, rows)
        bad = ~np.isfinite(norms) | ((np.abs(norms - 1.0) > 1e-3) & (norms != 0.0))
        if bad.any():
            row = start + int(np.argmax(bad))
            raise HyperProveError(f"{directory}: {name} vector {row} is not finite and of unit norm (squared norm "
                                  f"{float(norms[row - start])!r}){DAMAGED}")


def check_ids(directory: Path, what: str, ids: np.ndarray, count: int) -> None:
    """Every id in [0, count): a fact's passage, a listed entity, a synonym pair."""
    if len(ids) and (ids.min() < 0 or ids.max() >= count):
        wrong = int(ids[(ids < 0) | (ids >= count)][0])
        raise HyperProveError(f"{directory}: {what} {wrong} is out of range (there are {count}){DAMAGED}")


def _read_index(directory: Path, manifest: dict) -> HypergraphIndex:
    passage_ids, passages = array("q"), []
    for row in _jsonl_rows(directory / "passages.jsonl"):
        passage_ids.append(row["id"])
        passages.append(Passage(title=_text(row["title"], "a passage title"), text=_text(row["text"], "a passage text")))
    fact_text, fact_passage, lengths, listed, surfaces = [], array("q"), array("q"), array("q"), {}
    for number, fact in enumerate(_jsonl_rows(directory / "facts.jsonl")):  # columns, filled a row at a time
        fact_text.append(_text(fact["text"], "a fact text"))
        fact_passage.append(fact["passage"])
        lengths.append(len(fact["entities"]))
        listed.extend(fact["entities"])
        for entity, name in fact.get("surfaces", ()):
            surfaces[(number, int(entity))] = _text(name, "a surface name")
    entity_names = read_json(directory / "entities.json", "entities", damaged_hint=DAMAGED)
    entity_keys = read_json(directory / "entity_keys.json", "entity keys", damaged_hint=DAMAGED)
    if not isinstance(entity_names, list) or not isinstance(entity_keys, list) or not all(isinstance(n, str) for n in entity_names + entity_keys):
        raise TypeError("entities.json and entity_keys.json hold lists of names")
    if len(entity_keys) != len(entity_names):
        raise HyperProveError(f"{directory}: entity_keys.json does not match entities.json{DAMAGED}")
    check_ids(directory, "facts.jsonl names passage", np.array(fact_passage, dtype=np.int64), len(passages))
    check_ids(directory, "facts.jsonl names entity", np.array(listed, dtype=np.int64), len(entity_names))
    check_ids(directory, "facts.jsonl: a surface name's entity", np.array([e for _, e in surfaces], dtype=np.int64), len(entity_names))
    ids = np.array(passage_ids, dtype=np.int64)
    if len(np.unique(ids)) != len(ids) or (len(ids) and (ids.min() < 0 or ids.max() >= manifest["next_passage_id"])):
        raise HyperProveError(f"{directory}: passages.jsonl holds ids that repeat or lie outside [0, next_passage_id){DAMAGED}")
    lengths = np.array(lengths, dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    fact_entities, entity_order = listed_incidence(  # each fact's entities are stored as it listed them
        np.repeat(np.arange(len(fact_text)), lengths), np.array(listed, dtype=np.int64),
        np.arange(lengths.sum()) - np.repeat(starts, lengths), (len(fact_text), len(entity_names)))
    pairs = read_npy(directory / "synonyms.npy").reshape(-1, 2)
    if pairs.dtype.kind not in "iu":
        raise TypeError(f"synonyms.npy holds {pairs.dtype}, not entity ids")
    n_entities = len(entity_names)
    check_ids(directory, "synonyms.npy names entity", pairs.ravel().astype(np.int64), n_entities)
    synonyms = binary_csr(np.concatenate([pairs[:, 0], pairs[:, 1]]), np.concatenate([pairs[:, 1], pairs[:, 0]]), (n_entities, n_entities))
    vectors = {name: read_npy(directory / f"{name}_vectors.npy") for name in VECTOR_SETS}
    indexes = {name: VectorIndex(faiss.read_index(str(directory / index_file)),
                                 faiss.read_index(str(directory / added_file(index_file))) if added_file(index_file) in manifest["files"] else None)
               for name, index_file in VECTOR_SETS.items()}
    expected = {"fact": len(fact_text), "entity": n_entities, "passage": len(passages)}
    dim = manifest["embedder"]["dim"]
    for name, count in expected.items():
        if vectors[name].shape != (count, dim) or len(indexes[name]) != count:
            raise HyperProveError(f"{directory}: {name} vectors do not match the manifest counts; rebuild the index")
        check_vectors(directory, name, vectors[name], dim, count)
    info = {key: manifest[key] for key in ("extractor", "embedder", "config", "corpus_sha256", "generations", "built_on", "next_passage_id")
            if key in manifest}
    return HypergraphIndex.from_parts(passages, fact_text, np.array(fact_passage, dtype=np.int64), fact_entities, entity_names, synonyms,
                                      vectors, indexes, info, passage_ids=np.array(passage_ids, dtype=np.int64), surfaces=surfaces,
                                      entity_keys=entity_keys, entity_order=entity_order)


# --- the index cache -------------------------------------------------------------------------------
def index_key(passages: Sequence[Passage], config) -> str:
    """What a cached index is keyed on: the corpus, every setting that shapes the index, and the
    extractor's version (and, for the `lm` extractor, the LM), so a changed setting never
    reuses an index built with another."""
    from pipeline.extract import EXTRACTOR_VERSIONS

    shaping = {**config.index.shaping(), "extractor_version": EXTRACTOR_VERSIONS[config.index.extractor], "format_version": FORMAT_VERSION}
    if config.index.extractor != "sentences":  # an LM extractor: its facts are that LM's
        shaping["lm"] = config.lm.id
    digest = hashlib.sha256(json.dumps(shaping, sort_keys=True).encode()).hexdigest()[:16]
    return f"{corpus_checksum(passages)[:16]}-{config.index.extractor}-{digest}"


def cached_index(passages: list[Passage], config, runtime, log: Callable[[str], None] = print) -> tuple[HypergraphIndex, Path | None]:
    """The index of this corpus under this config (a `HyperProveConfig`), built once and kept in
    the cache dir; returns it and its directory (None when extraction fallbacks kept it out of
    the cache, so that the next run tries those passages again)."""
    from pipeline.extract import describe_extraction, extractor_for

    directory = Path(config.cache_dir) / "indexes" / index_key(passages, config)
    clear_scratch(directory.parent)  # what killed builds left, under this key or any other
    if (directory / "manifest.json").exists():
        return load_index(directory, expect=config.index), directory
    extractor = extractor_for(config, runtime)
    index = build_index(passages, config.index, runtime.embedder, progress=True, extractor=extractor)
    for line in describe_extraction(extractor):
        log(line)
    if extractor.report().get("fallbacks", 0):
        return index, None
    save_index(index, directory)
    return index, directory


def index_corpus(corpus: str | Path, out: str | Path, config, runtime=None, log: Callable[[str], None] = print) -> dict:
    """`hyperprove index`: build the index of a corpus file under a `HyperProveConfig` and save it
    to `out`, which is checked first (an earlier index may be replaced, nothing else)."""
    import time

    from pipeline.corpus import load_corpus
    from pipeline.extract import describe_extraction, extractor_for
    from pipeline.runtime import Runtime

    check_index_target(out)
    passages = load_corpus(corpus)
    runtime = runtime or Runtime(config)
    extractor = extractor_for(config, runtime)
    started = time.perf_counter()
    with writer_lock(out, log):  # a second build into the same folder waits, then replaces this one whole
        index = build_index(passages, config.index, runtime.embedder, progress=True, extractor=extractor)
        save_index(index, out)
    seconds = time.perf_counter() - started
    for line in describe_extraction(extractor):
        log(line)
    log(f"index written to {out}: {index.counts()} in {seconds:.1f} s")
    return {"index": str(out), **index.counts(), "extractor": extractor.report(), "seconds": round(seconds, 2)}


def add_to_index(added_corpus: str | Path, directory: str | Path, config, runtime=None, log: Callable[[str], None] = print) -> dict:
    """`hyperprove index --add NEW.json --into DIR`: the passages of `added_corpus` appended to the
    index in `directory` as its next generation, written atomically over it (a kill leaves the
    previous generation, loadable and unchanged; running the command again finishes the job).
    Passages the index already holds (same title and text) are skipped, so a second run after a
    finished one adds nothing."""
    import time

    from pipeline.corpus import load_corpus
    from pipeline.extract import describe_extraction, extractor_for
    from pipeline.runtime import Runtime

    offered = load_corpus(added_corpus)
    with writer_lock(directory, log):  # one writer at a time: a second waits, then adds to this one's generation
        index = load_index(directory, expect=config.index)
        present = {(p.title, p.text) for p in index.passages}
        added = [p for p in dict.fromkeys(offered) if (p.title, p.text) not in present]  # so that running it again adds nothing twice
        if len(added) < len(offered):
            log(f"{len(offered) - len(added)} of the {len(offered)} passages are in the index already (or repeated): skipped")
        if not added:
            log(f"{directory}: nothing to add; generation {index.generation} stays")
            return {"index": str(directory), "generation": index.generation, "added": 0, **index.counts(), "seconds": 0.0}
        runtime = runtime or Runtime(config)
        extractor = extractor_for(config, runtime)
        started = time.perf_counter()
        before, base = index.counts(), index.generation
        index = grow_index(index, added, config.index, runtime.embedder, progress=True, extractor=extractor)
        save_index(index, directory, replaces=base)
    seconds = time.perf_counter() - started
    for line in describe_extraction(extractor):
        log(line)
    generation = index.generation
    log(f"{directory}: generation {generation}, {len(added)} passages added ({before['passages']} -> {len(index.passages)}): "
        f"{index.counts()} in {seconds:.1f} s")
    return {"index": str(directory), "generation": generation, "added": len(added), **index.counts(), "seconds": round(seconds, 2)}


def read_deletions(path: str | Path) -> list[int | str]:
    """A deletions file: a JSON list of passage ids (integers, as the index numbers them) and/or
    titles (strings: every passage of that title)."""
    from pipeline.corpus import check_text, read_json_list

    path = Path(path)
    items = read_json_list(path, "deletions")
    for position, item in enumerate(items):
        if isinstance(item, bool) or not isinstance(item, (int, str)):
            raise HyperProveError(f"{path}: item {position} must be a passage id (an integer) or a title (a string), found {type(item).__name__}")
        if isinstance(item, str):
            check_text(path, position, "title", item)
    if not items:
        raise HyperProveError(f"{path}: the deletions list is empty")
    return items


def passages_to_remove(index: HypergraphIndex, wanted: Sequence[int | str], source: str, log: Callable[[str], None] = print) -> np.ndarray:
    """Positions of the passages that `wanted` names. An id or title an earlier generation removed
    is skipped with a note (so running a deletion again does nothing); one never in the index is
    an error naming it."""
    position_of = {int(i): k for k, i in enumerate(index.passage_ids)}
    titled: dict[str, list[int]] = {}
    for k, passage in enumerate(index.passages):
        titled.setdefault(passage.title, []).append(k)
    removed_in = {}
    for generation in index.info.get("generations", []):
        for passage_id, title in generation.get("removed_passages", []):
            removed_in[passage_id] = removed_in[title] = generation["generation"]
    positions: list[int] = []
    for item_number, item in enumerate(wanted):
        found = [position_of[item]] if isinstance(item, int) and item in position_of else titled.get(item, []) if isinstance(item, str) else []
        if found:
            positions += found
        elif item in removed_in:
            log(f"{source}: item {item_number} ({item!r}) was removed in generation {removed_in[item]}: skipped")
        else:
            kind = f"id {item}" if isinstance(item, int) else f"titled {item!r}"
            raise HyperProveError(f"{source}: item {item_number}: no passage {kind} in the index (passage ids are listed in its passages.jsonl)")
    return np.unique(np.array(positions, dtype=np.int64))


def delete_from_index(deletions: str | Path, directory: str | Path, config, runtime=None, log: Callable[[str], None] = print) -> dict:
    """`hyperprove index --delete IDS.json --into DIR`: the passages named in `deletions` (ids or
    titles) taken out of the index in `directory` as its next generation, written atomically over
    it (a kill leaves the previous generation; running the command again finishes the job, and
    after a finished run it finds nothing left to delete)."""
    import time

    from pipeline.runtime import Runtime

    wanted = read_deletions(deletions)
    with writer_lock(directory, log):  # one writer at a time: a second waits, then deletes from this one's generation
        index = load_index(directory, expect=config.index)
        removed = passages_to_remove(index, wanted, str(deletions), log)
        if not len(removed):
            log(f"{directory}: nothing to delete; generation {index.generation} stays")
            return {"index": str(directory), "generation": index.generation, "removed": 0, **index.counts(), "seconds": 0.0}
        if len(removed) == len(index.passages):
            raise HyperProveError(f"{deletions}: names every passage of {directory}; an index needs at least one (build a new one instead)")
        runtime = runtime or Runtime(config)
        started = time.perf_counter()
        before, base = index.counts(), index.generation
        index = shrink_index(index, removed, config.index, runtime.embedder)
        save_index(index, directory, replaces=base)
    seconds = time.perf_counter() - started
    change = index.info["generations"][-1]
    log(f"{directory}: generation {index.generation}, {len(removed)} passages removed ({before['passages']} -> {len(index.passages)}; "
        f"{change['facts_removed']} facts, {change['entities_removed']} entities, {change['renamed']} renamed): {index.counts()} in {seconds:.1f} s")
    return {"index": str(directory), "generation": index.generation, "removed": len(removed), **index.counts(), "seconds": round(seconds, 2)}
