"""The index on disk, and the index cache.

On disk an index is a directory of open-format files behind `manifest.json` (format version,
embedder id and dimension, extractor, counts, corpus checksum, the next passage id, a sha256 per
file, and the manifest's own checksum). It is written into a scratch directory and renamed into
place by one writer at a time, so a crash or Ctrl-C never leaves a half-written index and two
writers never lose each other's change; loading checks every checksum, shape, type and id range,
and a damaged, edited or mismatched index fails with one line saying what is wrong. Those checks
run once per change of the files: `derived/` (`pipeline.index.derived`) records what passed, with
columns that a later load reads in seconds.
"""

from __future__ import annotations

import gc
import hashlib
import itertools
import json
from array import array
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Callable, Iterator, Sequence

import faiss
import numpy as np
import scipy.sparse as sp

from modules.errors import HyperProveError
from modules.facts import Passage
from modules.retrieval.hypergraph import binary_csr
from modules.retrieval.vectors import CodedRows, VectorIndex
from pipeline.config import IndexConfig
from pipeline.files import (
    atomic_directory,
    atomic_save_npy,
    atomic_write_json,
    atomic_write_jsonl,
    check_replaceable,
    clear_scratch,
    map_npy,
    read_json,
    read_npy,
    recover,
    row_blocks,
    sha256_files,
    writer_lock,
)
from pipeline.index import derived
from pipeline.index.build import VECTOR_SETS, HypergraphIndex, build_index, corpus_checksum, listed_incidence
from pipeline.index.extract import EXTRACTOR_VERSIONS, describe_extraction, extractor_for

FORMAT = "hyperprove-index"
FORMAT_VERSION = 3  # 2: stable passage ids and surface names; 3: the manifest's own checksum and the next passage id
DAMAGED = "; the index is damaged, rebuild it"


def added_file(index_file: str) -> str:
    """The file of the vectors added to an IVF index since it was built (`VectorIndex.added`)."""
    return index_file.replace(".faiss", ".added.faiss")


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
    recover(directory / derived.FOLDER)  # what a load killed while writing derived/ left
    listed = _listed_files(directory) if directory.is_dir() else None  # None also for a foreign manifest.json
    check_replaceable(directory, None if listed is None else {"manifest.json", derived.FOLDER, *listed}, "a HyperProve index")


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
    check_generation(directory, replaces)
    with atomic_directory(directory) as scratch:
        entity_ptr = index.fact_entities.indptr
        owner = np.repeat(np.arange(len(index.fact_text)), np.diff(entity_ptr))
        listed = index.fact_entities.indices[np.lexsort((index.entity_order, owner))]  # each fact's entities as it listed them
        atomic_write_jsonl(scratch / "passages.jsonl", ({"id": int(i), "title": p.title, "text": p.text, **({"source": p.source} if p.source else {})}
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
        derived.write_derived(index, scratch, manifest, coded_sets(manifest))
        check_generation(directory, replaces)


def check_generation(directory: Path, replaces: int | None) -> None:
    """The directory still holds generation `replaces` (None: anything), else nothing is written."""
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
    built = {**IndexConfig.RECORDED_WITHOUT, **manifest["config"]}  # an index built before a setting existed went without it
    for name, wanted in expect.shaping().items():
        if name in built and built[name] != wanted:
            raise HyperProveError(f"{directory}: built with {name} {built[name]!r}, but {name} {wanted!r} was asked for; "
                                  f"ask for {built[name]!r} (--{name.replace('_', '-')} or index.{name} in the config) or rebuild the index")


def coded_sets(manifest: dict) -> list[str]:
    """The vector sets a load keeps as codes in memory and maps from disk: those IVF-PQ searches."""
    return sorted(name for name, kind in manifest.get("vector_search", {}).items() if kind == "ivfpq")


def load_index(directory: str | Path, expect_embedder: str | None = None, verify: bool = True,
               expect: IndexConfig | None = None) -> HypergraphIndex:
    """Load and check an index; any damage or mismatch is a one-line HyperProveError. `expect`
    checks every setting that shapes the index, `expect_embedder` the embedder alone. Each file
    is checked in full once per change: `derived/` records what passed (`pipeline.index.derived`)."""
    directory = Path(directory)
    manifest = read_manifest(directory)
    for name in manifest["files"]:
        if not (directory / name).exists():
            raise HyperProveError(f"{directory / name}: missing from the index; rebuild it")
    coded = coded_sets(manifest)
    with collector_paused():
        columns = derived.read_derived(directory, manifest, coded)
    if verify and columns is None:
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
        with collector_paused():
            index = _read_index(directory, manifest, columns, coded)
    except (ValueError, KeyError, TypeError, IndexError, OSError, EOFError, RuntimeError, RecursionError) as error:
        # A file that passed its checksum yet does not parse (written by hand, or truncated and re-summed).
        raise HyperProveError(f"{directory}: cannot be read ({type(error).__name__}: {str(error)[:120]}){DAMAGED}") from None
    if index.counts() != manifest.get("counts"):
        raise HyperProveError(f"{directory}/manifest.json: counts do not match the files; rebuild the index")
    if columns is None:
        if corpus_checksum(index.passages) != manifest["corpus_sha256"]:
            raise HyperProveError(f"{directory}/manifest.json: its corpus_sha256 is not the checksum of the passages in passages.jsonl{DAMAGED}")
        if verify:
            derived.try_write_derived(index, directory, manifest, coded)
    return index


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cycle collector off while millions of passages and texts are made: it would walk
    every object made so far, again and again (2.5M passages: 4.3 s with it, 1.8 s without)."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


def check_vectors(directory: Path, name: str, vectors: np.ndarray, dim: int, count: int, codes: CodedRows | None = None) -> None:
    """float32 rows of `dim`, finite and of unit norm (or all zero: a text with no words), a
    block of rows at a time: what search and the scores of step 9 assume of every vector.
    `codes`, where given, are filled from the same blocks (the file is read once)."""
    if vectors.dtype != np.float32 or vectors.shape != (count, dim):
        raise HyperProveError(f"{directory}: {name} vectors are {vectors.dtype} of shape {vectors.shape}, not float32 of "
                              f"({count}, {dim}) as the manifest counts say{DAMAGED}")
    for start, rows in row_blocks(vectors):
        norms = np.einsum("ij,ij->i", rows, rows)
        bad = ~np.isfinite(norms) | ((np.abs(norms - 1.0) > 1e-3) & (norms != 0.0))
        if bad.any():
            row = start + int(np.argmax(bad))
            raise HyperProveError(f"{directory}: {name} vector {row} is not finite and of unit norm (squared norm "
                                  f"{float(norms[row - start])!r}){DAMAGED}")
        if codes is not None:
            codes.put(start, rows)


def check_ids(directory: Path, what: str, ids: np.ndarray, count: int) -> None:
    """Every id in [0, count): a fact's passage, a listed entity, a synonym pair."""
    if len(ids) and (ids.min() < 0 or ids.max() >= count):
        wrong = int(ids[(ids < 0) | (ids >= count)][0])
        raise HyperProveError(f"{directory}: {what} {wrong} is out of range (there are {count}){DAMAGED}")


def _parsed_rows(directory: Path, manifest: dict, n_entities: int) -> dict:
    """passages.jsonl and facts.jsonl read and checked: what `derived.read_derived` gives."""
    passage_ids, passages = array("q"), []
    for row in _jsonl_rows(directory / "passages.jsonl"):
        passage_ids.append(row["id"])
        passages.append(Passage(title=_text(row["title"], "a passage title"), text=_text(row["text"], "a passage text"),
                                source=_text(row["source"], "a passage source") if "source" in row else None))
    fact_text, fact_passage, lengths, listed, surfaces = [], array("q"), array("q"), array("q"), {}
    for number, fact in enumerate(_jsonl_rows(directory / "facts.jsonl")):  # columns, filled a row at a time
        fact_text.append(_text(fact["text"], "a fact text"))
        fact_passage.append(fact["passage"])
        lengths.append(len(fact["entities"]))
        listed.extend(fact["entities"])
        for entity, name in fact.get("surfaces", ()):
            surfaces[(number, int(entity))] = _text(name, "a surface name")
    fact_passage = np.array(fact_passage, dtype=np.int64)
    check_ids(directory, "facts.jsonl names passage", fact_passage, len(passages))
    check_ids(directory, "facts.jsonl names entity", np.array(listed, dtype=np.int64), n_entities)
    check_ids(directory, "facts.jsonl: a surface name's entity", np.array([e for _, e in surfaces], dtype=np.int64), n_entities)
    ids = np.array(passage_ids, dtype=np.int64)
    if len(np.unique(ids)) != len(ids) or (len(ids) and (ids.min() < 0 or ids.max() >= manifest["next_passage_id"])):
        raise HyperProveError(f"{directory}: passages.jsonl holds ids that repeat or lie outside [0, next_passage_id){DAMAGED}")
    lengths = np.array(lengths, dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    fact_entities, entity_order = listed_incidence(  # each fact's entities are stored as it listed them
        np.repeat(np.arange(len(fact_text)), lengths), np.array(listed, dtype=np.int64),
        np.arange(lengths.sum()) - np.repeat(starts, lengths), (len(fact_text), n_entities))
    return {"passages": passages, "passage_ids": ids, "fact_text": fact_text, "fact_passage": fact_passage,
            "fact_entities": fact_entities, "entity_order": entity_order, "surfaces": surfaces}


def read_faiss(directory: Path, manifest: dict, index_file: str, stamps: dict | None = None) -> tuple[faiss.Index, faiss.Index | None]:
    """A vector set's FAISS index and the index of the vectors added since it was built; with
    `stamps`, the files must still be those a load checked (a deferred read, `VectorIndex(load=)`)."""
    names = [index_file, *([added_file(index_file)] if added_file(index_file) in manifest["files"] else [])]
    for name in names if stamps is not None else ():
        try:
            same = derived.stamp(directory / name) == stamps.get(name)
        except OSError:
            same = False
        if not same:
            raise HyperProveError(f"{directory / name}: changed or gone since the index was loaded; load it again")
    read = [faiss.read_index(str(directory / name)) for name in names]
    return read[0], read[1] if len(read) > 1 else None


def _read_index(directory: Path, manifest: dict, columns: dict | None, coded: list[str]) -> HypergraphIndex:
    """The index from its files; `columns`: the passages, facts and codes `derived/` holds, which
    passed every check when recorded (None: read and check them here); `coded`: `coded_sets`."""
    entity_names = read_json(directory / "entities.json", "entities", damaged_hint=DAMAGED)
    entity_keys = read_json(directory / "entity_keys.json", "entity keys", damaged_hint=DAMAGED)
    if not isinstance(entity_names, list) or not isinstance(entity_keys, list) or not all(isinstance(n, str) for n in entity_names + entity_keys):
        raise TypeError("entities.json and entity_keys.json hold lists of names")
    if len(entity_keys) != len(entity_names):
        raise HyperProveError(f"{directory}: entity_keys.json does not match entities.json{DAMAGED}")
    n_entities = len(entity_names)
    parts = dict(columns) if columns is not None else _parsed_rows(directory, manifest, n_entities)
    pairs = read_npy(directory / "synonyms.npy").reshape(-1, 2)
    if pairs.dtype.kind not in "iu":
        raise TypeError(f"synonyms.npy holds {pairs.dtype}, not entity ids")
    check_ids(directory, "synonyms.npy names entity", pairs.ravel().astype(np.int64), n_entities)
    synonyms = binary_csr(np.concatenate([pairs[:, 0], pairs[:, 1]]), np.concatenate([pairs[:, 1], pairs[:, 0]]), (n_entities, n_entities))
    mapped = {"entity", *coded}  # queries never read entity vectors (names are found by their words); updates read them in
    vectors = {name: (map_npy if name in mapped else read_npy)(directory / f"{name}_vectors.npy") for name in VECTOR_SETS}
    stamps = parts.pop("stamps", None)
    deferred = {"entity"} if stamps is not None else set()  # read by updates only, from the files the load checked
    indexes = {name: VectorIndex(None, load=partial(read_faiss, directory, manifest, index_file, stamps)) if name in deferred
               else VectorIndex(*read_faiss(directory, manifest, index_file)) for name, index_file in VECTOR_SETS.items()}
    expected = {"fact": len(parts["fact_text"]), "entity": n_entities, "passage": len(parts["passages"])}
    dim = manifest["embedder"]["dim"]
    codes = parts.pop("row_codes", {})
    for name, count in expected.items():
        if vectors[name].shape != (count, dim) or (name not in deferred and len(indexes[name]) != count):
            raise HyperProveError(f"{directory}: {name} vectors do not match the manifest counts; rebuild the index")
        if columns is None:
            if name in coded:  # queries read codes in memory, not rows of the file
                codes[name] = derived.untrained_codes(vectors[name])
            check_vectors(directory, name, vectors[name], dim, count, codes=codes.get(name))
    info = {key: manifest[key] for key in ("extractor", "embedder", "config", "corpus_sha256", "generations", "built_on", "next_passage_id", "documents")
            if key in manifest}
    return HypergraphIndex.from_parts(vectors=vectors, indexes=indexes, info=info, row_codes=codes, entity_names=entity_names,
                                      entity_keys=entity_keys, synonyms=synonyms, **parts)


# --- the index cache -------------------------------------------------------------------------------
def index_key(passages: Sequence[Passage], config) -> str:
    """What a cached index is keyed on: the corpus, every setting that shapes the index, and the
    extractor's version (and, for the `lm` extractor, the LM), so a changed setting never
    reuses an index built with another."""

    shaping = {**config.index.shaping(), "extractor_version": EXTRACTOR_VERSIONS[config.index.extractor], "format_version": FORMAT_VERSION}
    if config.index.extractor != "sentences":  # an LM extractor: its facts are that LM's
        shaping["lm"] = config.lm.id
    digest = hashlib.sha256(json.dumps(shaping, sort_keys=True).encode()).hexdigest()[:16]
    return f"{corpus_checksum(passages)[:16]}-{config.index.extractor}-{digest}"


def cached_index(passages: list[Passage], config, runtime, log: Callable[[str], None] = print,
                 make_runtime: Callable | None = None) -> tuple[HypergraphIndex, Path | None]:
    """The index of this corpus under this config (a `HyperProveConfig`), built once and kept in
    the cache dir; returns it and its directory (None when extraction fallbacks kept it out of
    the cache, so that the next run tries those passages again)."""

    directory = Path(config.cache_dir) / "indexes" / index_key(passages, config)
    clear_scratch(directory.parent)  # what killed builds left, under this key or any other
    if (directory / "manifest.json").exists():
        return load_index(directory, expect=config.index), directory
    extractor = extractor_for(config, runtime, make_runtime)
    index = build_index(passages, config.index, runtime.embedder, progress=True, extractor=extractor)
    for line in describe_extraction(extractor):
        log(line)
    if extractor.report().get("fallbacks", 0):
        return index, None
    save_index(index, directory)
    return index, directory
