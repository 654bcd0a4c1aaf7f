"""Files derived from a saved index, so that a load of millions of facts takes seconds.

A full load hashes every file (30 s at 10M facts), parses facts.jsonl row by row (60 s), checks
every vector's norm and codes the memory-mapped ones (20 s). `derived/` in the index folder
holds what those steps produce: the passages and facts as columns (.npy and plain UTF-8 text),
the 8-bit codes of each memory-mapped vector set, and a record of every listed file as it was
when a load or the writer checked it (size, mtime, ctime, inode). A later load that finds every
file as recorded reads the columns, maps the codes, and skips the checks the record says passed;
any change (a copy, an edit, a rebuild) makes it check everything again and write `derived/`
anew. The folder is not listed in the manifest, so the checksums that runs record are the same
with or without it, and deleting it only costs the next load its speed.

A file's times come from a clock that advances a tick at a time, so a file changed again within
the tick of its last write could keep its stamp (git's "racily clean" entries): the record is
written only once `SETTLED_NS` have passed since the last change of every file it stamps.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Sequence

import numpy as np
import scipy.sparse as sp

from modules.facts import Passage
from modules.retrieval.vectors import CodedRows
from pipeline.files import (
    atomic_directory,
    atomic_save_npy,
    atomic_write_json,
    atomic_write_with,
    map_npy,
    read_rows,
    row_blocks,
)

FOLDER = "derived"
FORMAT = "hyperprove-derived"
FORMAT_VERSION = 1
SETTLED_NS = 50_000_000  # 50 ms: several ticks of the coarsest clock Linux stamps files with (100 Hz)
CODE_SAMPLE = (16, 2048)  # runs of rows, spread over a vector set, that its codes' ranges are taken from
TEXT_BLOCK = 100_000  # texts encoded and written at a time
COUNTED = {"fact": "facts", "entity": "entities", "passage": "passages"}  # a vector set's count in the manifest


def stamp(path: Path) -> list[int]:
    """What changes when a file does: size, mtime, ctime (which no tool can set back) and inode."""
    status = path.stat()
    return [status.st_size, status.st_mtime_ns, status.st_ctime_ns, status.st_ino]


# --- text columns ----------------------------------------------------------------------------------
def write_texts(path: Path, texts: Sequence[str]) -> None:
    """`texts` as one UTF-8 file, joined with nothing between them, and `<name>_ends.npy`: where
    each ends, in characters. A block at a time, so a column never sits in memory twice."""
    ends = np.zeros(len(texts), dtype=np.int64)

    def write(handle) -> None:
        done = 0
        for start in range(0, len(texts), TEXT_BLOCK):
            block = texts[start:start + TEXT_BLOCK]
            ends[start:start + len(block)] = done + np.cumsum(np.fromiter(map(len, block), dtype=np.int64, count=len(block)))
            done = int(ends[start + len(block) - 1]) if len(block) else done
            handle.write("".join(block).encode())

    atomic_write_with(path, write)
    atomic_save_npy(ends_file(path), ends)


def ends_file(path: Path) -> Path:
    return path.with_name(f"{path.stem}_ends.npy")


def read_texts(path: Path) -> list[str]:
    """The texts `write_texts` wrote, each a slice of the decoded file (10M texts in about 3 s)."""
    joined = path.read_bytes().decode("utf-8")
    ends = np.load(ends_file(path), allow_pickle=False)
    if ends.ndim != 1 or (len(ends) and (ends[-1] != len(joined) or np.any(np.diff(ends) < 0) or ends[0] < 0)):
        raise ValueError(f"{path.name}: its ends do not fit its text")
    bounds = [0, *ends.tolist()]
    return list(map(joined.__getitem__, map(slice, bounds[:-1], bounds[1:])))


# --- codes -------------------------------------------------------------------------------------------
def spread_rows(vectors: np.ndarray, runs: int, length: int) -> np.ndarray:
    """`runs` runs of `length` rows spread evenly over a vector set, each read in one go (rows of
    a memory-mapped file picked one by one over the whole file are as many page reads: 20 s at
    10M vectors)."""
    starts = np.unique(np.linspace(0, max(len(vectors) - length, 0), runs).astype(np.int64))
    return np.concatenate([read_rows(vectors, int(start), int(start) + length) for start in starts])


def untrained_codes(vectors: np.ndarray) -> CodedRows:
    """Empty codes for every row of `vectors`, with ranges from `spread_rows` (fill them with `put`)."""
    return CodedRows.trained(spread_rows(vectors, *CODE_SAMPLE), len(vectors))


def code_rows(vectors: np.ndarray) -> CodedRows:
    """`vectors` coded a block of rows at a time."""
    codes = untrained_codes(vectors)
    for start, rows in row_blocks(vectors):
        codes.put(start, rows)
    return codes


def mapped_codes(folder: Path, name: str) -> CodedRows:
    """A set's codes mapped from their file (`read_in` reads the file into the page cache)."""
    codes = map_npy(folder / f"{name}_codes.npy")
    return CodedRows.from_ranges(np.load(folder / f"{name}_code_ranges.npy", allow_pickle=False), codes)


class ReadIn(threading.Thread):
    """Files read through once, in the background, so that the page cache holds them: queries
    read mapped codes at random, and a page fetched from disk in the middle of a hop costs it
    milliseconds (10M facts: hop p95 134 ms while mapped codes were still being read in).
    The load returns at once; `join()` waits for the read, `read_bytes` says how much it read."""

    BLOCK = 16 << 20

    def __init__(self, paths: Sequence[Path]):
        super().__init__(name="read-in", daemon=True)
        self.paths = list(paths)
        self.read_bytes = 0

    def run(self) -> None:
        buffer = memoryview(bytearray(self.BLOCK))
        for path in self.paths:
            try:
                with open(path, "rb", buffering=0) as handle:
                    while count := handle.readinto(buffer):  # the GIL is released while the kernel reads
                        self.read_bytes += count
            except OSError:  # gone or replaced: a query that maps it fails with its own message
                continue


def read_in(paths: Sequence[Path]) -> ReadIn:
    reader = ReadIn(paths)
    reader.start()
    return reader


# --- writing and reading ------------------------------------------------------------------------------
def write_derived(index, directory: Path, manifest: dict, coded: Sequence[str]) -> None:
    """`derived/` for `index` (a `HypergraphIndex`), saved in `directory` under `manifest` and checked;
    `coded`: the vector sets whose rows queries read from codes. Replaces an earlier one atomically."""
    with atomic_directory(directory / FOLDER) as folder:
        write_texts(folder / "passage_title.txt", [p.title for p in index.passages])
        write_texts(folder / "passage_text.txt", [p.text for p in index.passages])
        write_texts(folder / "passage_source.txt", [p.source or "" for p in index.passages])
        write_texts(folder / "fact_text.txt", index.fact_text)
        keys = sorted(index.surfaces)
        write_texts(folder / "surface_name.txt", [index.surfaces[key] for key in keys])
        arrays = {"passage_ids": index.passage_ids, "fact_passage": index.fact_passage, "fact_entity_ptr": index.fact_entities.indptr,
                  "fact_entity_ids": index.fact_entities.indices, "entity_order": index.entity_order,
                  "surface_keys": np.array(keys, dtype=np.int64).reshape(-1, 2)}
        for name, array in arrays.items():
            atomic_save_npy(folder / f"{name}.npy", array)
        for name in coded:
            codes = index.row_codes[name] if name in index.row_codes else code_rows(getattr(index, f"{name}_vectors"))
            atomic_save_npy(folder / f"{name}_codes.npy", codes.codes)
            atomic_save_npy(folder / f"{name}_code_ranges.npy", codes.ranges())
        files = {**{name: directory / name for name in manifest["files"]}, **{f"{FOLDER}/{p.name}": p for p in folder.iterdir()}}
        settled = max(max(stamp(path)[1:3]) for path in files.values()) + SETTLED_NS
        time.sleep(max(settled - time.time_ns(), 0) / 1e9)
        atomic_write_json(folder / "record.json", {
            "format": FORMAT, "format_version": FORMAT_VERSION, "index_manifest_sha256": manifest["manifest_sha256"],
            "coded": sorted(coded), "stamps": {name: stamp(path) for name, path in sorted(files.items())},
        })


def try_write_derived(index, directory: Path, manifest: dict, coded: Sequence[str]) -> None:
    """`write_derived` where the folder can be written; a read-only index loads fully each time."""
    try:
        write_derived(index, directory, manifest, coded)
    except OSError:
        pass


def read_derived(directory: Path, manifest: dict, coded: Sequence[str]) -> dict | None:
    """What `write_derived` wrote, when its record matches this manifest and every file is as it
    stamped it: the parts `HypergraphIndex.from_parts` takes from facts.jsonl and passages.jsonl
    and the coded sets' codes, and the stamps. None otherwise (the load then checks everything)."""
    folder = directory / FOLDER
    try:
        record = json.loads((folder / "record.json").read_text(encoding="utf-8"))
        if (record.get("format"), record.get("format_version"), record.get("index_manifest_sha256"), record.get("coded")) != \
                (FORMAT, FORMAT_VERSION, manifest["manifest_sha256"], sorted(coded)):
            return None
        stamps = record["stamps"]
        if not set(manifest["files"]) <= set(stamps):
            return None
        if any(stamp(directory / name) != recorded for name, recorded in stamps.items()):
            return None
        return {**_read_columns(folder, manifest, coded), "stamps": stamps}
    except (OSError, ValueError, KeyError, TypeError):  # missing, stale or damaged: the full load makes it again
        return None


def _read_columns(folder: Path, manifest: dict, coded: Sequence[str]) -> dict:
    counts = manifest["counts"]
    titles, texts, sources = (read_texts(folder / f"passage_{column}.txt") for column in ("title", "text", "source"))
    arrays = {name: np.load(folder / f"{name}.npy", allow_pickle=False)
              for name in ("passage_ids", "fact_passage", "fact_entity_ptr", "fact_entity_ids", "entity_order", "surface_keys")}
    fact_text = read_texts(folder / "fact_text.txt")
    names = read_texts(folder / "surface_name.txt")
    ptr, ids = arrays["fact_entity_ptr"], arrays["fact_entity_ids"]
    if not (len(titles) == len(texts) == len(sources) == len(arrays["passage_ids"]) == counts["passages"]
            and len(fact_text) == len(arrays["fact_passage"]) == len(ptr) - 1 == counts["facts"]
            and len(ids) == len(arrays["entity_order"]) == ptr[-1] == counts["incidences"] and len(names) == len(arrays["surface_keys"])):
        raise ValueError("the columns do not match the manifest counts")
    codes = {name: mapped_codes(folder, name) for name in coded}
    if any(codes[name].shape != (counts[COUNTED[name]], manifest["embedder"]["dim"]) for name in coded):
        raise ValueError("the codes do not match the manifest counts")
    reading = read_in([folder / f"{name}_codes.npy" for name in coded]) if coded else None
    fact_entities = sp.csr_matrix((np.ones(len(ids)), ids, ptr), shape=(counts["facts"], counts["entities"]))
    return {
        "passages": [Passage(title=t, text=x, source=s or None) for t, x, s in zip(titles, texts, sources)],
        "passage_ids": arrays["passage_ids"], "fact_text": fact_text, "fact_passage": arrays["fact_passage"],
        "fact_entities": fact_entities, "entity_order": arrays["entity_order"],
        "surfaces": {(int(row), int(entity)): name for (row, entity), name in zip(arrays["surface_keys"].tolist(), names)},
        "row_codes": codes, "reading": reading,
    }
