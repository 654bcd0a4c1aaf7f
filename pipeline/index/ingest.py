"""A folder -> index in batches of files, each checkpointed as it finishes: reading, extraction
and embedding hold one batch in memory, and a build killed part-way and run again resumes at
its first unfinished batch and gives the index an uninterrupted build gives.

The checkpoints live in OUT.building/ beside the index, one folder per batch (its passages,
its facts with the entity names each lists, their vectors), named by the batch's number and
key. The key is a sha256 of the batch's files (path and content) and of all that shapes a
batch's output (the reading, the extractor, the embedder, the batch size), so a checkpoint is
used only where the batch's work would come out the same. A batch's work depends on its own
files alone (a passage that an earlier batch holds is dropped when the batches are joined, not
before), which lets `--ray` workers take batches in any order. Joining numbers passages, facts
and entities as one read of the whole folder numbers them (`read_folder`, `index_of`); entity
names, synonyms and the FAISS indexes are made then, and OUT.building/ is removed once the
index is written.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np

from modules.errors import HyperProveError
from modules.facts import Fact, Passage
from pipeline.files import atomic_directory, atomic_save_npy, atomic_write_json, clear_scratch, lock_path, sha256_file
from pipeline.index.build import HypergraphIndex, checked_extractor, embedded, index_of
from pipeline.index.changes import appended_rows
from pipeline.index.documents import (
    REPEATS,
    FolderCorpus,
    ParsedDocuments,
    ParsedInMemory,
    Reading,
    document_files,
    file_of,
    is_document,
    read_documents,
    shown,
)
from pipeline.index.extract import Extractor

CHECKPOINT_FORMAT = "hyperprove-batch"
CHECKPOINT_VERSION = 1  # what a batch's work is and how it is written: a change here keys every batch anew
VECTORS = ("fact", "passage")


@dataclass
class Batch:
    number: int
    files: list[tuple[Path, str]]  # (path, path in the folder)
    key: str

    @property
    def name(self) -> str:
        return f"{self.number:05d}-{self.key[:16]}"


@dataclass
class BatchPart:
    """One batch's work: its files read (`FolderCorpus`, repeats within the batch dropped), their
    facts (each `passage` a position among the part's passages) and vectors by VECTORS name."""

    corpus: FolderCorpus
    facts: list[Fact]
    vectors: dict[str, np.ndarray]
    retry: bool = False  # done again by a later build (an LM extractor fell back for some passage)
    parsed: dict = field(default_factory=dict)  # a Ray worker's files read (`ParsedInMemory`), which the driver keeps


def building_folder(out: str | Path) -> Path:
    """Where a build into `out` keeps its batches until the index is written."""
    out = Path(out)
    return out.with_name(f"{out.name}.building")


def file_digest(path: Path, reading: Reading) -> bytes:
    """What a batch key takes of a file: its content's sha256 where it is a document the reading
    reads; else its size (a file over the budget, or of another kind, is not read at all)."""
    try:
        size = path.stat().st_size
        if not is_document(path) or size > reading.max_file_mb * 2**20:
            return f"size {size}".encode()
        return bytes.fromhex(sha256_file(path))
    except OSError as error:
        return f"unreadable {error.strerror or error}".encode()


def batch_key(settings: dict, files: Sequence[tuple[Path, str]], reading: Reading) -> str:
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
    for path, relative in files:
        digest.update(b"\0" + relative.encode("utf-8", "surrogateescape") + b"\0" + file_digest(path, reading))
    return digest.hexdigest()


def ingest_batch(root: Path, files: Sequence[tuple[Path, str]], reading: Reading, extractor: Extractor, embedder,
                 parsed: ParsedDocuments | None = None) -> BatchPart:
    """Read (keeping each file's passages in `parsed`, for later updates), extract and embed one
    batch of files; what it skips is kept in the part, not logged."""
    corpus = read_documents(root, files, reading, log=lambda line: None, parsed=parsed)
    facts = [fact for per_passage in extractor.extract(corpus.passages) for fact in per_passage]
    return BatchPart(corpus, facts, embedded(facts, corpus.passages, corpus.passages, embedder, progress=False))


# --- checkpoints --------------------------------------------------------------------------------------
def save_part(part: BatchPart, directory: Path) -> None:
    """A batch's checkpoint, written whole or not at all (`atomic_directory`)."""
    with atomic_directory(directory) as scratch:
        for name in VECTORS:
            atomic_save_npy(scratch / f"{name}_vectors.npy", part.vectors[name])
        corpus = part.corpus
        atomic_write_json(scratch / "part.json", {
            "format": CHECKPOINT_FORMAT, "format_version": CHECKPOINT_VERSION,
            "files": corpus.files, "skipped": corpus.skipped, "other_kinds": corpus.other_kinds,
            "passages": [[p.title, p.text, p.source] for p in corpus.passages],
            "facts": [[f.text, f.passage, list(f.entities)] for f in part.facts],
            "vectors": {name: sha256_file(scratch / f"{name}_vectors.npy") for name in VECTORS},
        })
        if part.retry:
            (scratch / "retry").touch()


def finished(directory: Path) -> bool:
    """A batch's checkpoint is there, and not one to be done again."""
    return (directory / "part.json").is_file() and not (directory / "retry").exists()


def load_part(directory: Path, root: Path) -> BatchPart | None:
    """A batch's checkpoint, its vectors memory-mapped; None where it is missing or damaged (the
    batch is then done again)."""
    try:
        record = json.loads((directory / "part.json").read_text(encoding="utf-8"))
        if record.get("format") != CHECKPOINT_FORMAT or record.get("format_version") != CHECKPOINT_VERSION:
            return None
        vectors = {}
        for name in VECTORS:
            path = directory / f"{name}_vectors.npy"
            if sha256_file(path) != record["vectors"][name]:
                return None
            vectors[name] = np.load(path, mmap_mode="r", allow_pickle=False)
        corpus = FolderCorpus(root=root, passages=[Passage(t, x, s) for t, x, s in record["passages"]], files=record["files"],
                              skipped=record["skipped"], other_kinds=record["other_kinds"])
        facts = [Fact(text, tuple(entities), passage) for text, passage, entities in record["facts"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if len(vectors["fact"]) != len(facts) or len(vectors["passage"]) != len(corpus.passages):
        return None
    return BatchPart(corpus, facts, vectors)


# --- the build ----------------------------------------------------------------------------------------
def plan_batches(root: Path, files: list[tuple[Path, str]], size: int, settings: dict, reading: Reading) -> list[Batch]:
    return [Batch(number, files[start:start + size], batch_key({**settings, "root": str(root)}, files[start:start + size], reading))
            for number, start in enumerate(range(0, len(files), size))]


def ingest_folder(folder: str | Path, out: str | Path, config, runtime, extractor: Extractor | None = None,
                  log: Callable[[str], None] = print, workers: Callable | None = None) -> tuple[HypergraphIndex, FolderCorpus]:
    """The index of a folder's documents, built in batches of `index.batch_files` files, each
    checkpointed in `building_folder(out)`; the batches a killed build finished are not done
    again. `workers(batches)`, where given, does the batches elsewhere (`--ray`), yielding each
    (batch, part) as it finishes. The caller writes the index and then removes the checkpoints
    (`finish`). Returns the index and what was read."""
    root = Path(folder)
    index_config = config.index
    reading = Reading.of(index_config)
    extractor = checked_extractor(index_config, extractor)
    listing: list[str] = []
    building = building_folder(out)
    ours = {os.path.realpath(path) for path in (building, lock_path(out))}
    files = list(document_files(root, reading.follow_links, lambda line: (listing.append(line), log(line)), ours))
    identity = {key: value for key, value in extractor.report().items() if key in ("name", "version", "lm", "rules")}  # not its counts
    settings = {"version": CHECKPOINT_VERSION, "reading": reading.record(), "extractor": identity,
                "embedder": runtime.embedder.id, "embedder_batch": index_config.batch_size}
    batches = plan_batches(root, files, index_config.batch_files, settings, reading)
    clear_scratch(building)  # checkpoints a killed build was writing
    todo = [batch for batch in batches if not finished(building / batch.name)]
    if len(todo) < len(batches):
        log(f"resuming: {len(batches) - len(todo)} of {len(batches)} batches were finished earlier, kept in {building}/")
    from tqdm import tqdm

    bar = tqdm(total=len(files), initial=len(files) - sum(len(b.files) for b in todo), desc="index files", unit="file", mininterval=1.0)
    counts = {"passages": 0, "facts": 0}
    started = time.perf_counter()
    parsed = ParsedDocuments(config.cache_dir)
    for batch, part in (workers or here(root, reading, extractor, runtime.embedder, parsed))(todo):
        save_part(part, building / batch.name)
        counts["passages"] += len(part.corpus.passages)
        counts["facts"] += len(part.facts)
        bar.set_postfix_str(f"{counts['passages']} passages, {counts['facts']} facts", refresh=False)
        bar.update(len(batch.files))
    bar.close()
    if todo:
        log(f"{len(todo)} batches read, extracted and embedded in {time.perf_counter() - started:.1f} s: "
            f"{counts['passages']} passages, {counts['facts']} facts")
    parts = (load_part(building / batch.name, root) or redo(batch, root, reading, extractor, runtime.embedder, building, log, parsed)
             for batch in batches)
    corpus, facts, vectors = join(root, parts, log)
    corpus.skipped[:0] = listing
    if not corpus.passages:
        finish(out)  # nothing in them worth keeping
        raise HyperProveError(f"{root}: no document with text in it" + (f" ({len(corpus.skipped)} skipped)" if corpus.skipped else ""))
    return index_of(corpus.passages, facts, vectors, index_config, runtime.embedder, extractor), corpus


def here(root: Path, reading: Reading, extractor: Extractor, embedder, parsed: ParsedDocuments | None = None
         ) -> Callable[[list[Batch]], Iterator[tuple[Batch, BatchPart]]]:
    """`ingest_folder`'s `workers` in this process: one batch after another. A batch in which an
    LM extractor fell back to sentences for some passage is marked to be done again by a later
    build (the extraction cache keeps what the LM did answer), as fallbacks are never cached."""

    def run(batches: list[Batch]) -> Iterator[tuple[Batch, BatchPart]]:
        for batch in batches:
            before = extractor.report().get("fallbacks", 0)
            part = ingest_batch(root, batch.files, reading, extractor, embedder, parsed)
            part.retry = extractor.report().get("fallbacks", 0) > before
            yield batch, part

    return run


def redo(batch: Batch, root: Path, reading: Reading, extractor: Extractor, embedder, building: Path, log,
         parsed: ParsedDocuments | None = None) -> BatchPart:
    """A batch whose checkpoint is damaged, done again (and checkpointed)."""
    log(f"{building / batch.name}: damaged; the batch is done again")
    part = ingest_batch(root, batch.files, reading, extractor, embedder, parsed)
    save_part(part, building / batch.name)
    return part


def join(root: Path, parts: Iterator[BatchPart], log: Callable[[str], None]) -> tuple[FolderCorpus, list[Fact], dict[str, np.ndarray]]:
    """The batches as one read of the folder: a passage an earlier batch holds is dropped with its
    facts, a file none of whose passages is left is skipped as `read_documents` skips it, facts
    point at their passages' positions in the whole. Each part's vectors are copied into one
    array per name, grown in place, so they are never held twice."""
    corpus = FolderCorpus(root=root, passages=[], files={})
    facts: list[Fact] = []
    vectors: dict[str, np.ndarray] = {}
    taken: set[Passage] = set()
    for part in parts:
        kept = np.array([not (p in taken or taken.add(p)) for p in part.corpus.passages], dtype=bool)
        position = np.cumsum(kept) - 1 + len(corpus.passages)
        held = {file_of(p.source) for p, keep in zip(part.corpus.passages, kept) if keep}
        for line in part.corpus.skipped:
            log(line)
        corpus.skipped += part.corpus.skipped
        for relative, digest in part.corpus.files.items():
            if relative in held:
                corpus.files[relative] = digest
            else:
                line = f"{shown(str(root / relative))}: skipped: {REPEATS}"
                log(line)
                corpus.skipped.append(line)
        for suffix, n in part.corpus.other_kinds.items():
            corpus.other_kinds[suffix] = corpus.other_kinds.get(suffix, 0) + n
        corpus.passages += [p for p, keep in zip(part.corpus.passages, kept) if keep]
        fact_kept = kept[[f.passage for f in part.facts]] if part.facts else np.zeros(0, dtype=bool)
        facts += [Fact(f.text, f.entities, int(position[f.passage])) for f, keep in zip(part.facts, fact_kept) if keep]
        for name, rows in (("fact", fact_kept), ("passage", kept)):
            new = np.asarray(part.vectors[name])[rows]
            vectors[name] = appended_rows(vectors.get(name, np.zeros((0, *new.shape[1:]), dtype=np.float32)), new)
    return corpus, facts, vectors


def finish(out: str | Path) -> None:
    """The checkpoints of a build whose index is written: removed."""
    shutil.rmtree(building_folder(out), ignore_errors=True)


# --- on Ray -------------------------------------------------------------------------------------------
class FolderWorker:
    """A Ray worker (`pipeline.lm.cluster.WorkerPool`) doing batches of files with its own
    extractor and the embedder of `make_runtime(config)`, on one torch thread (the workers share
    the cores); it writes nothing."""

    def __init__(self, config: dict, make_runtime: Callable, root: str):
        from pipeline.config import HyperProveConfig
        from pipeline.index.extract import make_extractor
        from pipeline.runtime import apply_library_defaults

        apply_library_defaults()
        import torch

        torch.set_num_threads(1)
        config = HyperProveConfig.from_dict(config)
        self.root, self.reading = Path(root), Reading.of(config.index)
        self.extractor = make_extractor(config.index.extractor, rules=config.index.sentence_rules)
        self.embedder = make_runtime(config).embedder

    def ingest(self, number: int, files: list[tuple[str, str]]) -> tuple[int, BatchPart]:
        parsed = ParsedInMemory()
        part = ingest_batch(self.root, [(Path(path), relative) for path, relative in files], self.reading, self.extractor,
                            self.embedder, parsed)
        part.parsed = parsed.entries
        return number, part


def ray_workers(config, root: str | Path, make_runtime: Callable, log: Callable[[str], None] = print
                ) -> Callable[[list[Batch]], Iterator[tuple[Batch, BatchPart]]]:
    """`ingest_folder`'s `workers` on the Ray cluster of `cluster.ray`: the batches over
    `FolderWorker`s, each with `make_runtime(config)`'s embedder, started when the first batch
    is asked for and let go after the last. The files each worker read are kept here
    (`ParsedDocuments`), for later updates."""
    from pipeline.lm.cluster import WorkerPool, ray_module

    ray_module()  # the extra is missing: say so before any work
    kept = ParsedDocuments(config.cache_dir)

    def run(batches: list[Batch]) -> Iterator[tuple[Batch, BatchPart]]:
        if not batches:
            return
        pool = WorkerPool(config, FolderWorker, make_runtime, str(Path(root).resolve()))
        try:
            log(f"--ray: {len(batches)} batches over {pool.workers} workers (ready after {pool.wait_ready():.1f} s)")
            numbered = {batch.number: batch for batch in batches}
            asked = [(batch.number, [(str(path.resolve()), relative) for path, relative in batch.files]) for batch in batches]
            for number, part in pool.stream(lambda worker, item: worker.ingest.remote(*item), asked, "indexing"):
                for key, read in part.parsed.items():
                    kept.put(key, read)
                part.parsed = {}
                yield numbered[number], part
        finally:
            pool.close()

    return run
