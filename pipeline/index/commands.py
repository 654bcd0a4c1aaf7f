"""The `index` command: build an index from a corpus, add passages to it, delete them from it.

Each holds the index's writer lock from reading the index to renaming the new generation into
place, so two commands on one index change it one after the other.
"""

from __future__ import annotations

import resource
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from modules.errors import HyperProveError
from modules.facts import Passage
from pipeline.files import (
    sha256_file,
    writer_lock,
)
from pipeline.index.build import HypergraphIndex, build_index, corpus_checksum
from pipeline.index.changes import grow_index, shrink_index
from pipeline.index.corpus import check_text, load_corpus, read_json_list
from pipeline.index.documents import FolderCorpus, ParsedDocuments, Reading, file_of, read_folder, shown
from pipeline.index.extract import LM_EXTRACTORS, describe_extraction, extractor_for
from pipeline.index.ingest import finish, ingest_folder, ray_workers
from pipeline.index.store import check_index_target, load_index, save_index
from pipeline.runtime import Runtime


def index_corpus(corpus: str | Path, out: str | Path, config, runtime=None, log: Callable[[str], None] = print,
                 make_runtime: Callable | None = None) -> dict:
    """`hyperprove index`: build the index of a corpus file, or of a folder's documents (in
    checkpointed batches, `ingest_folder`: a killed build run again resumes), under a
    `HyperProveConfig` and save it to `out`, which is checked first (an earlier index may be
    replaced, nothing else). With `cluster.ray`, LM extraction runs on Ray workers, each with
    `make_runtime(config)`; with an extractor that asks no LM, a folder's batches do."""

    check_index_target(out)
    reading = Reading.of(config.index)
    is_folder = Path(corpus).is_dir()
    passages = None if is_folder else load_corpus(corpus)
    runtime = runtime or Runtime(config)
    extractor = extractor_for(config, runtime, make_runtime)
    spread = config.cluster.ray is not None and config.index.extractor not in LM_EXTRACTORS
    if spread and not is_folder:
        note_ray_unused(config, log)
    started = time.perf_counter()
    with writer_lock(out, log):  # a second build into the same folder waits, then replaces this one whole
        if is_folder:
            workers = ray_workers(config, corpus, make_runtime or Runtime, log) if spread else None
            index, folder = ingest_folder(corpus, out, config, runtime, extractor, log, workers)
            log(folder.summary())
            index.info["documents"] = documents_record(folder, reading)
        else:
            folder, index = None, build_index(passages, config.index, runtime.embedder, progress=True, extractor=extractor)
        save_index(index, out)
        finish(out)
    seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
    for line in describe_extraction(extractor):
        log(line)
    log(f"index written to {out}: {index.counts()} in {seconds:.1f} s; peak memory of this process {peak:.2f} GiB")
    return {"index": str(out), **index.counts(), **({"files": len(folder.files), "skipped": len(folder.skipped)} if folder else {}),
            "extractor": extractor.report(), "seconds": round(seconds, 2), "peak_rss_gib": round(peak, 2)}


def corpus_passages(corpus: str | Path, reading: Reading, log: Callable[[str], None] = print) -> tuple[list[Passage], FolderCorpus | None]:
    """A corpus file's passages, or a folder's documents read as passages (`read_folder`, its
    summary logged), with what the folder read took (None for a file)."""
    folder = read_folder(corpus, reading, log, progress=True) if Path(corpus).is_dir() else None
    if folder:
        log(folder.summary())
    return (folder.passages if folder else load_corpus(corpus)), folder


def corpus_digest(corpus: str | Path, passages: Sequence[Passage]) -> str:
    """What a run records of its corpus: a file's sha256, or, for a folder, that of the passages read from it."""
    return sha256_file(corpus) if Path(corpus).is_file() else corpus_checksum(passages)


def note_ray_unused(config, log: Callable[[str], None]) -> None:
    """`--ray` with an extractor that asks no LM on passages (not a folder's): nothing to spread,
    and the user is told so."""

    if config.cluster.ray is not None and config.index.extractor not in LM_EXTRACTORS:
        log(f"--ray: the {config.index.extractor} extractor asks no LM, so the index is built here")


def add_to_index(added_corpus: str | Path, directory: str | Path, config, runtime=None, log: Callable[[str], None] = print,
                 make_runtime: Callable | None = None) -> dict:
    """`hyperprove index --add NEW --into DIR`: the passages of a corpus file appended to the index
    in `directory`, or a folder's documents brought up to date (`folder_update`), as its next
    generation, written atomically over it (a kill leaves the previous generation, loadable and
    unchanged; running the command again finishes the job). Passages the index already holds
    (same title and text) are skipped, so a second run after a finished one changes nothing."""

    with writer_lock(directory, log):  # one writer at a time: a second waits, then adds to this one's generation
        index = load_index(directory, expect=config.index)
        if Path(added_corpus).is_dir():
            update = folder_update(index, added_corpus, log, ParsedDocuments(config.cache_dir))
        else:
            offered = load_corpus(added_corpus)
            update = FolderUpdate(removed=np.zeros(0, dtype=np.int64), added=new_passages(index, offered, set()))
            if len(update.added) < len(offered):
                log(f"{len(offered) - len(update.added)} of the {len(offered)} passages are in the index already (or repeated): skipped")
        base, before = index.generation, index.counts()
        if not update.changes_anything(index):
            log(f"{directory}: nothing to add; generation {base} stays")
            return {"index": str(directory), "generation": base, "added": 0, "removed": 0, **before, "seconds": 0.0}
        runtime = runtime or Runtime(config)
        started = time.perf_counter()
        index.passages = update.passages or index.passages
        extractor = None
        if len(update.removed):
            index = shrink_index(index, update.removed, config.index, runtime.embedder)
        if update.added:
            note_ray_unused(config, log)
            extractor = extractor_for(config, runtime, make_runtime)
            index = grow_index(index, update.added, config.index, runtime.embedder, progress=True, extractor=extractor)
        if update.documents is not None:
            index.info["documents"] = update.documents
        save_index(index, directory, replaces=base)
    seconds = time.perf_counter() - started
    for line in describe_extraction(extractor) if extractor else ():
        log(line)
    removed = f" and {len(update.removed)} removed" if len(update.removed) else ""
    log(f"{directory}: generation {index.generation}, {len(update.added)} passages added{removed} "
        f"({before['passages']} -> {len(index.passages)}): {index.counts()} in {seconds:.1f} s")
    return {"index": str(directory), "generation": index.generation, "added": len(update.added), "removed": len(update.removed),
            **index.counts(), "seconds": round(seconds, 2)}


def new_passages(index: HypergraphIndex, offered: Sequence[Passage], leaving: set[int]) -> list[Passage]:
    """`offered` less repeats and passages the index holds (but for those at positions `leaving`)."""
    present = {p for k, p in enumerate(index.passages) if k not in leaving}
    return [p for p in dict.fromkeys(offered) if p not in present]


@dataclass
class FolderUpdate:
    """What bringing an index up to date with a folder changes: passages leaving (positions) and
    coming, the index's passages with their sources renumbered, and its documents record."""

    removed: np.ndarray
    added: list[Passage]
    passages: list[Passage] | None = None
    documents: dict | None = None

    def changes_anything(self, index: HypergraphIndex) -> bool:
        return bool(len(self.removed) or self.added or (self.documents is not None and self.documents != index.info.get("documents"))
                    or (self.passages is not None and [p.source for p in self.passages] != [p.source for p in index.passages]))


def documents_record(folder: FolderCorpus, reading: Reading, earlier: dict | None = None) -> dict:
    """What an index keeps of the folders it read: the first folder's path (documents are keyed
    relative to it), how they were read (`Reading`), and each document's checksum."""
    record = earlier or {"root": str(folder.root.resolve()), **reading.record(), "files": {}}
    return {**record, "files": dict(sorted({**record["files"], **folder.files}.items()))}


def folder_prefix(documents: dict | None, folder: str | Path) -> str:
    """Where `folder` sits under the index's first folder ("" for that folder, "sub/" inside
    it); a folder elsewhere keys its documents by their absolute path."""
    resolved = Path(folder).resolve()
    if documents is None:
        return ""
    try:
        inside = resolved.relative_to(documents["root"]).as_posix()
    except ValueError:
        return resolved.as_posix() + "/"
    return "" if inside == "." else inside + "/"


def folder_update(index: HypergraphIndex, folder: str | Path, log: Callable[[str], None] = print,
                  parsed: ParsedDocuments | None = None) -> FolderUpdate:
    """The folder's documents against the index's record of them, split as the index's documents
    were: an unchanged file (same checksum) is left alone; of a changed one only the passages
    whose text changed leave and come (the others keep their ids and take their new sources); a
    new one comes whole. A document of the index that the folder no longer holds is kept and
    named (`--delete` takes it out). The folder is read through `parsed`: only files it does not
    hold already are parsed."""
    documents = index.info.get("documents")
    built = index.info["config"]
    reading = Reading.recorded(documents) if documents else \
        Reading(built.get("passage_words", 120), built.get("passage_overlap", 20))
    prefix = folder_prefix(documents, folder)
    read = read_folder(folder, reading, log, prefix=prefix, progress=True, parsed=parsed)
    known = documents["files"] if documents else {}
    changed = {key for key, digest in read.files.items() if known.get(key) != digest}
    missing = sorted(key for key in known if key.startswith(prefix) and key not in read.files)
    log(f"{read.summary()}; {len(changed)} new or changed, {len(read.files) - len(changed)} unchanged"
        + (f"; {len(missing)} in the index but no longer here, kept (index --delete FILE --into ... takes one out): {', '.join(missing[:3])}"
           + (" ..." if len(missing) > 3 else "") if missing else ""))
    coming = [p for p in read.passages if file_of(p.source) in changed]
    source_now = {p: p.source for p in read.passages}  # a passage a changed file dropped may be held by another, unchanged one
    leaving = {k for k, p in enumerate(index.passages) if file_of(p.source) in changed and p not in source_now}
    passages = [Passage(p.title, p.text, source_now.get(p, p.source)) if file_of(p.source) in changed else p for p in index.passages]
    return FolderUpdate(removed=np.array(sorted(leaving), dtype=np.int64), added=new_passages(index, coming, leaving),
                        passages=passages, documents=documents_record(read, reading, documents))


def held_elsewhere(documents: dict, leaving: Sequence[str], parsed: ParsedDocuments | None = None) -> FolderCorpus | None:
    """The index's first folder read again (through `parsed`) without the documents `leaving`
    (None when it is gone or holds nothing else): which document now holds a passage that two of
    them shared, since a folder's repeated passage is indexed once, under the first document
    that has it."""
    root = Path(documents["root"])
    if not root.is_dir():
        return None
    try:
        return read_folder(root, Reading.recorded(documents), log=lambda line: None, leave_out=set(leaving), parsed=parsed)
    except HyperProveError:
        return None


def joining(still: FolderCorpus | None, documents: dict, passages: Sequence[Passage]) -> dict[str, str]:
    """The documents of `still` the record lacks (each passage of theirs repeated another
    document's) whose passages the index now all holds: their checksums, so that a later update
    leaves them alone."""
    if still is None:
        return {}
    held = set(passages)
    lacking = {file_of(p.source) for p in still.passages if p not in held}
    return {key: digest for key, digest in still.files.items() if key not in documents["files"] and key not in lacking}


def read_deletions(path: str | Path) -> list[int | str]:
    """A deletions file: a JSON list of passage ids (integers, as the index numbers them) and/or
    titles (strings: every passage of that title)."""

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
        if passage.source:
            titled.setdefault(file_of(passage.source), []).append(k)  # a document's path names its passages
    removed_in = {}
    for generation in index.info.get("generations", []):
        for passage_id, title in generation.get("removed_passages", []):
            removed_in[passage_id] = removed_in[title] = generation["generation"]
        for path in generation.get("removed_files", []):
            removed_in[path] = generation["generation"]
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


def named_documents(index: HypergraphIndex, path: str | Path) -> list[str] | None:
    """The index's documents that `path` names (a document, or a folder holding some): a path on
    disk by where it is, else by the index's key (relative to the index's first folder). A
    relative path that is on disk here and names another file of the index's folder is refused
    as ambiguous. None when the index holds no folder's documents or `path` names none of them,
    nor one removed earlier (then it is a deletions file)."""
    documents = index.info.get("documents")
    if not documents:
        return None
    here = Path(path)

    def named_by(key: str) -> list[str]:  # key "": the first folder itself
        named = [k for k in documents["files"] if not key or k == key or k.startswith(f"{key}/")]
        return named or [k for g in index.info.get("generations", []) for k in g.get("removed_files", []) if k == key]

    by_place = named_by(shown(folder_prefix(documents, here).removesuffix("/")))  # as a path from here
    if here.is_absolute() or (Path(documents["root"]) / here).resolve() == here.resolve():
        return by_place or None
    in_root = named_by(shown(here.as_posix()))  # as the index keys it
    if in_root and (here.exists() or by_place):
        raise HyperProveError(f"{path}: names {shown(str(here.resolve()))} here and also {len(in_root)} document(s) of the index's "
                              f"folder {documents['root']}; give the full path of the one you mean")
    return by_place or in_root or None


def delete_from_index(deletions: str | Path, directory: str | Path, config, runtime=None, log: Callable[[str], None] = print) -> dict:
    """`hyperprove index --delete IDS.json --into DIR`: the passages named in `deletions` (a list of
    ids, titles and document paths; or a document or folder of documents the index read) taken out of the index in `directory` as its next generation, written atomically over
    it (a kill leaves the previous generation; running the command again finishes the job, and
    after a finished run it finds nothing left to delete)."""

    with writer_lock(directory, log):  # one writer at a time: a second waits, then deletes from this one's generation
        index = load_index(directory, expect=config.index)
        named = named_documents(index, deletions)
        wanted = named if named is not None else read_deletions(deletions)
        removed = passages_to_remove(index, wanted, str(deletions), log)
        documents = index.info.get("documents")
        still = held_elsewhere(documents, named, ParsedDocuments(config.cache_dir)) if named and documents and len(removed) else None
        source_of = {p: p.source for p in still.passages} if still else {}
        kept = {k for k in removed.tolist() if index.passages[k] in source_of}
        if kept:  # a passage another document also holds was indexed once, under the one leaving: it stays, under the other
            index.passages = [Passage(p.title, p.text, source_of[p]) if k in kept else p for k, p in enumerate(index.passages)]
            removed = np.setdiff1d(removed, sorted(kept))
            log(f"{deletions}: {len(kept)} of its passages are also in other documents: kept, under those")
        if not len(removed) and not kept:
            log(f"{directory}: nothing to delete; generation {index.generation} stays")
            return {"index": str(directory), "generation": index.generation, "removed": 0, **index.counts(), "seconds": 0.0}
        if len(removed) == len(index.passages):
            raise HyperProveError(f"{deletions}: names every passage of {directory}; an index needs at least one (build a new one instead)")
        runtime = runtime or Runtime(config)
        started = time.perf_counter()
        before, base = index.counts(), index.generation
        index = shrink_index(index, removed, config.index, runtime.embedder)
        if documents:  # a document none of whose passages is left leaves the record; one the index now holds whole joins it
            left = {file_of(p.source) for p in index.passages}
            files = {**joining(still, documents, index.passages), **documents["files"]}
            index.info["documents"] = {**documents, "files": {k: v for k, v in sorted(files.items()) if k in left}}
            index.info["generations"][-1]["removed_files"] = sorted(documents["files"].keys() - left)
        save_index(index, directory, replaces=base)
    seconds = time.perf_counter() - started
    change = index.info["generations"][-1]
    log(f"{directory}: generation {index.generation}, {len(removed)} passages removed ({before['passages']} -> {len(index.passages)}; "
        f"{change['facts_removed']} facts, {change['entities_removed']} entities, {change['renamed']} renamed): {index.counts()} in {seconds:.1f} s")
    return {"index": str(directory), "generation": index.generation, "removed": len(removed), **index.counts(), "seconds": round(seconds, 2)}
