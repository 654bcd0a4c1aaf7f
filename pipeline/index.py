"""Corpus -> hypergraph index (steps 1-3), and its on-disk format.

On disk an index is a directory of open-format files behind `manifest.json` (format version,
embedder id and dimension, extractor, counts, corpus checksum and a sha256 per file). It is
written into a scratch directory and renamed into place, so a crash or Ctrl-C never leaves a
half-written index; loading checks every checksum and shape, and a damaged or mismatched index
fails with one line saying what is wrong.
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Callable, Sequence

import faiss
import numpy as np
import scipy.sparse as sp

from modules.errors import HyperProveError
from modules.facts import Fact, Passage
from modules.hypergraph import Hypergraph, binary_csr, expand_synonyms
from modules.retriever import FactTable, HypergraphRetriever, RetrieverConfig
from modules.vectors import VectorIndex
from pipeline.files import atomic_directory, atomic_save_npy, atomic_write_bytes, atomic_write_json, read_json, sha256_file
from pipeline.config import IndexConfig
from pipeline.extract import Extractor, make_extractor, subject_name

FORMAT = "hyperprove-index"
FORMAT_VERSION = 1
SYNONYM_QUERY_CHUNK = 65_536
SYNONYM_NPROBE = 4  # IVF lists scanned per name: synonyms (cos > 0.8) are near-duplicates, in the same cell
DAMAGED = "; the index is damaged, rebuild it"
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


def corpus_checksum(passages: Sequence[Passage]) -> str:
    payload = json.dumps([[p.title, p.text] for p in passages], ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(payload.encode()).hexdigest()


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
    info: dict = field(default_factory=dict)  # extractor, embedder, config, corpus checksum

    @cached_property
    def hypergraph(self) -> Hypergraph:
        incidence = expand_synonyms(self.fact_entities, self.synonyms)
        return Hypergraph(incidence, self.fact_passage, len(self.passages))

    @property
    def fact_table(self) -> FactTable:
        return FactTable(
            text=self.fact_text,
            passage=self.fact_passage,
            passage_titles=[p.title for p in self.passages],
            vectors=self.fact_vectors,
            index=self.fact_index,
        )

    def retriever(self, config: RetrieverConfig, encode: Callable[[str], np.ndarray]) -> HypergraphRetriever:
        return HypergraphRetriever(self.hypergraph, self.fact_table, encode, config)

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
) -> HypergraphIndex:
    """Steps 2-3 on extracted, embedded facts: synonyms and the FAISS indexes."""
    synonyms, entity_index = synonym_matrix(vectors["entity"], config.eta, config.synonym_neighbors, config.exact_search_max)
    return HypergraphIndex(
        passages=passages,
        fact_text=fact_text,
        fact_passage=np.asarray(fact_passage, dtype=np.int64),
        fact_entities=fact_entities,
        entity_names=entity_names,
        synonyms=synonyms,
        fact_vectors=vectors["fact"],
        entity_vectors=vectors["entity"],
        passage_vectors=vectors["passage"],
        fact_index=VectorIndex.build(vectors["fact"], exact_max=config.exact_search_max),
        entity_index=entity_index,
        passage_index=VectorIndex.build(vectors["passage"], exact_max=config.exact_search_max),
        info=info,
    )


def build_index(passages: list[Passage], config: IndexConfig, embedder, progress: bool = True, extractor: Extractor | None = None) -> HypergraphIndex:
    """Extract facts, give entities global ids, embed facts/entities/passages, assemble.

    `extractor` is needed for the `lm` extractor (it carries the LM); `sentences` is made here.
    """
    extractor = extractor or make_extractor(config.extractor)
    if extractor.name != config.extractor:
        raise HyperProveError(f"index config names extractor {config.extractor!r} but {extractor.name!r} was given")
    facts: list[Fact] = [fact for per_passage in extractor.extract(passages, progress=progress) for fact in per_passage]
    key_to_id: dict[str, int] = {}
    entity_names: list[str] = []
    rows, cols = [], []
    for fact_id, fact in enumerate(facts):
        for name in fact.entities:
            key = normalise_entity(name)
            if not key:
                continue
            if key not in key_to_id:
                key_to_id[key] = len(entity_names)
                entity_names.append(name)
            rows.append(fact_id)
            cols.append(key_to_id[key])
    fact_entities = binary_csr(np.array(rows, dtype=np.int64), np.array(cols, dtype=np.int64), (len(facts), len(entity_names)))
    label = (lambda name: name) if progress else (lambda name: None)
    vectors = {
        "fact": embedder.encode([fact_embedding_text(f, passages[f.passage]) for f in facts], progress=label("embed facts")),
        "entity": embedder.encode(entity_names, progress=label("embed entities")),
        "passage": embedder.encode([p.titled_text for p in passages], progress=label("embed passages")),
    }
    info = {
        "extractor": extractor.report(),
        "embedder": {"id": embedder.id, "dim": int(vectors["fact"].shape[1]) if len(facts) else embedder.dim},
        "config": asdict(config),
        "corpus_sha256": corpus_checksum(passages),
    }
    return assemble_index(
        passages, [f.text for f in facts], np.array([f.passage for f in facts], dtype=np.int64),
        fact_entities, entity_names, vectors, config, info,
    )


# --- on disk -------------------------------------------------------------------------------------
def _jsonl(rows: list) -> bytes:
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows).encode()


def save_index(index: HypergraphIndex, directory: str | Path) -> Path:
    """Write atomically: the directory appears complete, or not at all."""
    directory = Path(directory)
    if directory.exists() and not (directory / "manifest.json").exists() and any(directory.iterdir()):
        raise HyperProveError(f"{directory}: exists and is not a HyperProve index; choose another --out")
    with atomic_directory(directory) as scratch:
        entity_ptr = index.fact_entities.indptr
        atomic_write_bytes(scratch / "passages.jsonl", _jsonl([{"title": p.title, "text": p.text} for p in index.passages]))
        atomic_write_bytes(
            scratch / "facts.jsonl",
            _jsonl([
                {"text": text, "passage": int(passage), "entities": index.fact_entities.indices[entity_ptr[i] : entity_ptr[i + 1]].tolist()}
                for i, (text, passage) in enumerate(zip(index.fact_text, index.fact_passage))
            ]),
        )
        atomic_write_json(scratch / "entities.json", index.entity_names)
        upper = sp.triu(index.synonyms, k=1).tocoo()
        atomic_save_npy(scratch / "synonyms.npy", np.stack([upper.row, upper.col], axis=1).astype(np.int64))
        for name, index_file in VECTOR_SETS.items():
            atomic_save_npy(scratch / f"{name}_vectors.npy", getattr(index, f"{name}_vectors"))
            faiss.write_index(getattr(index, f"{name}_index").index, str(scratch / index_file))
        files = sorted(p.name for p in scratch.iterdir())
        manifest = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            **index.info,
            "counts": index.counts(),
            "vector_search": {name: getattr(index, f"{name}_index").kind for name in VECTOR_SETS},
            "files": {name: {"sha256": sha256_file(scratch / name), "bytes": (scratch / name).stat().st_size} for name in files},
        }
        atomic_write_json(scratch / "manifest.json", manifest)
    return directory


def read_manifest(directory: str | Path) -> dict:
    directory = Path(directory)
    path = directory / "manifest.json"
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
    return manifest


def _read_jsonl(path: Path) -> list:
    rows = []
    for line_number, line in enumerate(path.read_text().splitlines(), start=1):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            raise HyperProveError(f"{path}: line {line_number} is not valid JSON{DAMAGED}") from None
    return rows


def load_index(directory: str | Path, expect_embedder: str | None = None, verify: bool = True) -> HypergraphIndex:
    """Load and check an index; any damage or mismatch is a one-line HyperProveError."""
    directory = Path(directory)
    manifest = read_manifest(directory)
    listed = manifest.get("files", {})
    required = {"passages.jsonl", "facts.jsonl", "entities.json", "synonyms.npy"}
    required |= set(VECTOR_SETS.values()) | {f"{name}_vectors.npy" for name in VECTOR_SETS}
    missing = sorted(required - set(listed))
    if missing:
        raise HyperProveError(f"{directory}/manifest.json: lists no {missing[0]}; rebuild the index")
    for name, entry in listed.items():
        path = directory / name
        if not path.exists():
            raise HyperProveError(f"{path}: missing from the index; rebuild it")
        if verify and sha256_file(path) != entry["sha256"]:
            raise HyperProveError(f"{path}: checksum mismatch, the index is damaged; rebuild it")
    embedder = manifest.get("embedder", {}).get("id")
    if expect_embedder is not None and embedder != expect_embedder:
        raise HyperProveError(f"{directory}: built with embedder {embedder!r}, but {expect_embedder!r} was asked for")
    passages = [Passage(title=row["title"], text=row["text"]) for row in _read_jsonl(directory / "passages.jsonl")]
    fact_rows = _read_jsonl(directory / "facts.jsonl")
    entity_names = read_json(directory / "entities.json", "entities", damaged_hint=DAMAGED)
    lengths = [len(row["entities"]) for row in fact_rows]
    fact_entities = sp.csr_matrix(
        (np.ones(sum(lengths)), np.array([e for row in fact_rows for e in row["entities"]], dtype=np.int64),
         np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)),
        shape=(len(fact_rows), len(entity_names)),
    )
    pairs = np.load(directory / "synonyms.npy", allow_pickle=False).reshape(-1, 2)
    n_entities = len(entity_names)
    synonyms = binary_csr(np.concatenate([pairs[:, 0], pairs[:, 1]]), np.concatenate([pairs[:, 1], pairs[:, 0]]), (n_entities, n_entities))
    vectors = {name: np.load(directory / f"{name}_vectors.npy", allow_pickle=False) for name in VECTOR_SETS}
    indexes = {name: VectorIndex(faiss.read_index(str(directory / index_file))) for name, index_file in VECTOR_SETS.items()}
    expected = {"fact": len(fact_rows), "entity": n_entities, "passage": len(passages)}
    dim = manifest["embedder"]["dim"]
    for name, count in expected.items():
        if vectors[name].shape != (count, dim) or len(indexes[name]) != count:
            raise HyperProveError(f"{directory}: {name} vectors do not match the manifest counts; rebuild the index")
    info = {key: manifest[key] for key in ("extractor", "embedder", "config", "corpus_sha256")}
    index = HypergraphIndex(
        passages=passages,
        fact_text=[row["text"] for row in fact_rows],
        fact_passage=np.array([row["passage"] for row in fact_rows], dtype=np.int64),
        fact_entities=fact_entities,
        entity_names=entity_names,
        synonyms=synonyms,
        fact_vectors=vectors["fact"],
        entity_vectors=vectors["entity"],
        passage_vectors=vectors["passage"],
        fact_index=indexes["fact"],
        entity_index=indexes["entity"],
        passage_index=indexes["passage"],
        info=info,
    )
    if index.counts() != manifest.get("counts"):
        raise HyperProveError(f"{directory}/manifest.json: counts do not match the files; rebuild the index")
    return index

