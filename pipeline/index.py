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
from pipeline.config import IndexConfig
from pipeline.extract import Extractor, make_extractor, subject_name
from pipeline.files import (
    atomic_directory, atomic_save_npy, atomic_write_bytes, atomic_write_json, check_replaceable, clear_scratch, read_json, recover,
    sha256_file,
)

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
            passages=self.passages,
            vectors=self.fact_vectors,
            index=self.fact_index,
        )

    @classmethod
    def from_parts(cls, passages: list[Passage], fact_text: list[str], fact_passage, fact_entities: sp.csr_matrix,
                   entity_names: list[str], synonyms: sp.csr_matrix, vectors: dict[str, np.ndarray],
                   indexes: dict[str, VectorIndex], info: dict) -> "HypergraphIndex":
        """From the arrays a build computes or a load reads; `vectors` and `indexes` by VECTOR_SETS name."""
        return cls(
            passages=passages, fact_text=fact_text, fact_passage=np.asarray(fact_passage, dtype=np.int64),
            fact_entities=fact_entities, entity_names=entity_names, synonyms=synonyms,
            **{f"{name}_vectors": vectors[name] for name in VECTOR_SETS}, **{f"{name}_index": indexes[name] for name in VECTOR_SETS},
            info=info,
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
    indexes = {"entity": entity_index, **{name: VectorIndex.build(vectors[name], exact_max=config.exact_search_max) for name in ("fact", "passage")}}
    return HypergraphIndex.from_parts(passages, fact_text, fact_passage, fact_entities, entity_names, synonyms, vectors, indexes, info)


def build_index(passages: list[Passage], config: IndexConfig, embedder, progress: bool = True, extractor: Extractor | None = None) -> HypergraphIndex:
    """Extract facts, give entities global ids, embed facts/entities/passages, assemble.

    `extractor` is needed for the `lm` extractor (it carries the LM); `sentences` is made here.
    """
    extractor = extractor or make_extractor(config.extractor)
    if extractor.name != config.extractor:
        raise HyperProveError(f"index config names extractor {config.extractor!r} but {extractor.name!r} was given")
    facts: list[Fact] = [fact for per_passage in extractor.extract(passages, progress=progress) for fact in per_passage]
    entity_names: list[str] = []
    fact_entities = entity_incidence(facts, {}, entity_names)
    vectors = embed_new(facts, entity_names, passages, passages, embedder, progress)
    info = {
        "extractor": extractor.report(),
        "embedder": {"id": embedder.id, "dim": int(vectors["fact"].shape[1]) if len(facts) else embedder.dim},
        "config": asdict(config),
        "corpus_sha256": corpus_checksum(passages),
        "generations": [{"generation": 0, "added": len(passages), "facts": len(facts)}],
    }
    return assemble_index(
        passages, [f.text for f in facts], np.array([f.passage for f in facts], dtype=np.int64),
        fact_entities, entity_names, vectors, config, info,
    )


def entity_incidence(facts: Sequence[Fact], key_to_id: dict[str, int], entity_names: list[str]) -> sp.csr_matrix:
    """Step 1's entity nodes: A_i of each fact as entity ids, over the normalised names. A name
    not in `key_to_id` gets the next id and is appended to `entity_names` (both are updated), so
    growing an index numbers new names as a build of the whole corpus would."""
    rows, cols = [], []
    for row, fact in enumerate(facts):
        for name in fact.entities:
            key = normalise_entity(name)
            if not key:
                continue
            if key not in key_to_id:
                key_to_id[key] = len(entity_names)
                entity_names.append(name)
            rows.append(row)
            cols.append(key_to_id[key])
    return binary_csr(np.array(rows, dtype=np.int64), np.array(cols, dtype=np.int64), (len(facts), len(entity_names)))


def embed_new(facts: Sequence[Fact], names: Sequence[str], passages: Sequence[Passage], corpus: Sequence[Passage], embedder,
              progress: bool) -> dict[str, np.ndarray]:
    """The vectors of new facts (with their passage's subject, from `corpus`), names and passages."""
    label = (lambda name: name) if progress else (lambda name: None)
    return {
        "fact": embedder.encode([fact_embedding_text(f, corpus[f.passage]) for f in facts], progress=label("embed facts")),
        "entity": embedder.encode(list(names), progress=label("embed entities")),
        "passage": embedder.encode([p.titled_text for p in passages], progress=label("embed passages")),
    }


def grow_index(index: HypergraphIndex, added: list[Passage], config: IndexConfig, embedder, progress: bool = True,
               extractor: Extractor | None = None) -> HypergraphIndex:
    """The index with `added` appended as passages len(index.passages)...: only they are extracted
    and embedded, and only the new names (and the old names they find above eta) are searched
    for synonyms, against every name. Facts, entities and passages keep their ids; the FAISS
    indexes grow in place (an IVF index keeps the lists it was trained with). On the same data a
    build of the whole corpus gives the same ids, vectors and incidence; see `grow_synonyms`.
    `index` is consumed: its FAISS indexes are the new one's."""
    extractor = extractor or make_extractor(config.extractor)
    if extractor.name != index.info["extractor"]["name"]:
        raise HyperProveError(f"the index was built with the {index.info['extractor']['name']!r} extractor; grow it with the same, not {extractor.name!r}")
    passages = index.passages + list(added)
    facts = [fact for per_passage in extractor.extract(added, first_id=len(index.passages), progress=progress) for fact in per_passage]
    names = list(index.entity_names)
    key_to_id = {normalise_entity(name): k for k, name in enumerate(names)}
    incidence = entity_incidence(facts, key_to_id, names)
    old = index.fact_entities
    widened = sp.csr_matrix((old.data, old.indices, old.indptr), shape=(old.shape[0], len(names)))
    fact_entities = sp.vstack([widened, incidence]).tocsr()
    fresh = embed_new(facts, names[len(index.entity_names):], added, passages, embedder, progress)
    vectors = {name: np.concatenate([getattr(index, f"{name}_vectors"), fresh[name]]).astype(np.float32) for name in VECTOR_SETS}
    indexes = {}
    for name in VECTOR_SETS:
        indexes[name] = getattr(index, f"{name}_index")
        if len(fresh[name]):
            indexes[name].index.add(np.ascontiguousarray(fresh[name], dtype=np.float32))
    synonyms = grow_synonyms(index.synonyms, vectors["entity"], indexes["entity"], len(index.entity_names), config.eta, config.synonym_neighbors)
    generations = index.info.get("generations") or [{"generation": 0, "added": len(index.passages), "facts": len(index.fact_text)}]
    info = {**index.info, "corpus_sha256": corpus_checksum(passages),
            "generations": [*generations, {"generation": generations[-1]["generation"] + 1, "added": len(added), "facts": len(facts),
                                           "first_passage": len(index.passages), "extractor": extractor.report()}]}
    return HypergraphIndex.from_parts(passages, index.fact_text + [f.text for f in facts],
                                      np.concatenate([index.fact_passage, np.array([f.passage for f in facts], dtype=np.int64)]),
                                      fact_entities, names, synonyms, vectors, indexes, info)


def grow_synonyms(synonyms: sp.csr_matrix, entity_vectors: np.ndarray, entity_index: VectorIndex, first_new: int, eta: float,
                  neighbors: int) -> sp.csr_matrix:
    """Step 2 for new names, giving the pairs a build of the whole corpus gives. A pair is two
    names each within the other's reach: one of the `neighbors` nearest names of the other, above
    eta. New names can change that for an old name only if one of them lies above eta from it
    (then it may enter the old name's list and push a pair out): those old names and their old
    partners have their lists searched again, the new names theirs, and their pairs are redone;
    every other pair stays as it was."""
    n = len(entity_vectors)
    if first_new == n:
        return synonyms
    new = np.arange(first_new, n)
    _, near = entity_index.within(entity_vectors[new], eta, nprobe=SYNONYM_NPROBE)
    affected = np.unique(near[near < first_new])
    old = synonyms.tocsr()
    partners = old[affected].indices if len(affected) else np.zeros(0, dtype=np.int64)
    redone = np.union1d(np.union1d(affected, partners), new)
    scores, found = entity_index.search(entity_vectors[redone], neighbors + 1, nprobe=SYNONYM_NPROBE)
    keep = (scores > eta) & (found >= 0) & (found != redone[:, None])
    rows, cols = np.broadcast_to(redone[:, None], found.shape)[keep], found[keep]
    kept = old.tocoo()
    stays = ~np.isin(kept.row, affected) & ~np.isin(kept.col, affected)
    all_rows = np.concatenate([kept.row[stays], rows, cols])
    all_cols = np.concatenate([kept.col[stays], cols, rows])
    return binary_csr(all_rows.astype(np.int64), all_cols.astype(np.int64), (n, n))


# --- on disk -------------------------------------------------------------------------------------
def _jsonl(rows: list) -> bytes:
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows).encode()


def _listed_files(directory: Path) -> set[str] | None:
    """The files a HyperProve index manifest in `directory` lists; None when there is no such manifest."""
    try:
        manifest = json.loads((directory / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
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


def save_index(index: HypergraphIndex, directory: str | Path) -> Path:
    """Write atomically: the directory appears complete, or not at all."""
    directory = Path(directory)
    check_index_target(directory)
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


REQUIRED_FILES = {"passages.jsonl", "facts.jsonl", "entities.json", "synonyms.npy",
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
    shapes = {"files": dict, "counts": dict, "config": dict, "extractor": dict, "embedder": dict, "corpus_sha256": str}
    for key, kind in shapes.items():
        if not isinstance(manifest.get(key), kind):
            raise HyperProveError(f"{path}: {key!r} is missing or not a {kind.__name__}{DAMAGED}")
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


def _read_jsonl(path: Path) -> list:
    """Rows of a JSONL file. Lines end at "\n" only: str.splitlines() would also split inside a
    text at U+2028, U+2029 or U+0085, which json.dumps(ensure_ascii=False) writes as they are."""
    rows = []
    lines = path.read_text(encoding="utf-8").split("\n")
    if lines[-1] == "":
        lines.pop()  # after the last newline
    for line_number, line in enumerate(lines, start=1):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            raise HyperProveError(f"{path}: line {line_number} is not valid JSON{DAMAGED}") from None
    return rows


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
    for name, entry in manifest["files"].items():
        path = directory / name
        if not path.exists():
            raise HyperProveError(f"{path}: missing from the index; rebuild it")
        if verify and sha256_file(path) != entry["sha256"]:
            raise HyperProveError(f"{path}: checksum mismatch, the index is damaged; rebuild it")
    embedder = manifest["embedder"]["id"]
    if expect_embedder is not None and embedder != expect_embedder:
        raise HyperProveError(f"{directory}: built with embedder {embedder!r}, but {expect_embedder!r} was asked for")
    if expect is not None:
        check_built_with(manifest, directory, expect)
    try:
        index = _read_index(directory, manifest)
    except (ValueError, KeyError, TypeError, IndexError, OSError, EOFError, RuntimeError) as error:
        # A file that passed its checksum yet does not parse (written by hand, or truncated and re-summed).
        raise HyperProveError(f"{directory}: cannot be read ({type(error).__name__}: {str(error)[:120]}){DAMAGED}") from None
    if index.counts() != manifest.get("counts"):
        raise HyperProveError(f"{directory}/manifest.json: counts do not match the files; rebuild the index")
    return index


def _read_index(directory: Path, manifest: dict) -> HypergraphIndex:
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
    info = {key: manifest[key] for key in ("extractor", "embedder", "config", "corpus_sha256", "generations") if key in manifest}
    return HypergraphIndex.from_parts(passages, [row["text"] for row in fact_rows], [row["passage"] for row in fact_rows],
                                      fact_entities, entity_names, synonyms, vectors, indexes, info)


# --- the index cache -------------------------------------------------------------------------------
def index_key(passages: Sequence[Passage], config) -> str:
    """What a cached index is keyed on: the corpus, every setting that shapes the index, and the
    extractor's version (and, for the `lm` extractor, the LM), so a changed setting never
    reuses an index built with another."""
    from pipeline.extract import EXTRACTOR_VERSIONS

    shaping = {**config.index.shaping(), "extractor_version": EXTRACTOR_VERSIONS[config.index.extractor]}
    if config.index.extractor == "lm":
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

    index = load_index(directory, expect=config.index)
    offered = load_corpus(added_corpus)
    present = {(p.title, p.text) for p in index.passages}
    added = [p for p in dict.fromkeys(offered) if (p.title, p.text) not in present]  # so that running it again adds nothing twice
    if len(added) < len(offered):
        log(f"{len(offered) - len(added)} of the {len(offered)} passages are in the index already (or repeated): skipped")
    if not added:
        log(f"{directory}: nothing to add; generation {index.info.get('generations', [{}])[-1].get('generation', 0)} stays")
        return {"index": str(directory), "generation": index.info.get("generations", [{}])[-1].get("generation", 0), "added": 0,
                **index.counts(), "seconds": 0.0}
    runtime = runtime or Runtime(config)
    extractor = extractor_for(config, runtime)
    started = time.perf_counter()
    before = index.counts()
    index = grow_index(index, added, config.index, runtime.embedder, progress=True, extractor=extractor)
    save_index(index, directory)
    seconds = time.perf_counter() - started
    for line in describe_extraction(extractor):
        log(line)
    generation = index.info["generations"][-1]["generation"]
    log(f"{directory}: generation {generation}, {len(added)} passages added ({before['passages']} -> {len(index.passages)}): "
        f"{index.counts()} in {seconds:.1f} s")
    return {"index": str(directory), "generation": generation, "added": len(added), **index.counts(), "seconds": round(seconds, 2)}
