"""File helpers: atomic writes (a reader sees the old file or the new one, never half of one),
checksums, and JSON reads that fail with one line naming the file.

Scratch files and folders are named after the process that writes them (`.NAME.tmp-PID`), so a
later write of the same target removes what a killed process left behind, and a folder caught
between its two renames (`.NAME.old-PID` and no NAME) is put back.
"""

from __future__ import annotations

import fcntl
import hashlib
import itertools
import json
import os
import re
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Callable, Iterable, Iterator, Sequence

from modules.errors import HyperProveError


def process_alive(pid: int) -> bool:
    """Whether a process with this id exists on this machine."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, under another user
        return True
    return True


SCRATCH = re.compile(r"^\.(?P<name>.+)\.(?P<kind>tmp|old)-(?P<pid>\d+)$")  # `.NAME.tmp-PID`, `.NAME.old-PID`


def _abandoned(entry: Path) -> re.Match | None:
    """The scratch name of `entry` when the process that made it no longer exists."""
    match = SCRATCH.match(entry.name)
    pid = int(match["pid"]) if match else 0
    return match if match and pid != os.getpid() and not process_alive(pid) else None


def _left_behind(target: Path, kind: str) -> list[Path]:
    """The `.NAME.<kind>-PID` siblings of `target` whose process no longer exists."""
    try:
        siblings = list(target.parent.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [p for p in siblings if (m := _abandoned(p)) and m["name"] == target.name and m["kind"] == kind]


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def recover(target: str | Path) -> None:
    """Clean up after a killed writer of `target`: put back a folder it had moved aside but not
    yet replaced, and remove its scratch."""
    target = Path(target)
    for retired in _left_behind(target, "old"):
        if not target.exists():
            os.replace(retired, target)
        else:
            _remove(retired)
    for scratch in _left_behind(target, "tmp"):
        _remove(scratch)


def clear_scratch(directory: str | Path, depth: int = 1) -> None:
    """`recover` every target in a cache folder (and `depth` - 1 levels below) that a killed
    process was writing: there no later write of the same name may come to clean up."""
    try:
        entries = list(Path(directory).iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return
    for entry in entries:
        if match := _abandoned(entry):
            recover(entry.with_name(match["name"]))
        elif depth > 1 and entry.is_dir() and not entry.name.startswith("."):
            clear_scratch(entry, depth - 1)


def read_json(path: str | Path, what: str, damaged_hint: str = ""):
    """Parse a JSON file; a missing, unreadable, non-UTF-8 or malformed file is a one-line HyperProveError."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise HyperProveError(f"{path}: {what} file not found") from None
    except IsADirectoryError:
        raise HyperProveError(f"{path}: is a directory, not a {what} file") from None
    except OSError as error:
        raise HyperProveError(f"{path}: cannot read the {what} file ({error.strerror or error})") from None
    except UnicodeDecodeError:
        raise HyperProveError(f"{path}: not UTF-8 text") from None
    except json.JSONDecodeError as error:
        raise HyperProveError(f"{path}: not valid JSON ({error.msg}, line {error.lineno}){damaged_hint}") from None
    except RecursionError:
        raise HyperProveError(f"{path}: JSON nested too deeply to be a {what} file{damaged_hint}") from None


def atomic_write_bytes(path: str | Path, data: bytes, sync: bool = True) -> None:
    atomic_write_with(path, lambda handle: handle.write(data), sync)


def atomic_write_with(path: str | Path, write: Callable[[BinaryIO], object], sync: bool = True) -> None:
    """`write(handle)` into a temporary file beside `path`, synced (but for a cache entry, which a
    crash may leave empty and which is then made again), then renamed over it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    recover(path)
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(temporary, "wb") as handle:
        write(handle)
        handle.flush()
        if sync:
            os.fsync(handle.fileno())
    os.replace(temporary, path)


def atomic_write_jsonl(path: str | Path, rows: Iterable, block: int = 10_000) -> None:
    """One JSON object a line, written a block of lines at a time: a million facts never sit in
    memory as one string (that was 140 MB more at the peak of saving an index)."""
    encode = json.JSONEncoder(ensure_ascii=False).encode  # json.dumps(row, ensure_ascii=False), without a new encoder a row

    def write(handle: BinaryIO) -> None:
        remaining = iter(rows)
        while lines := [encode(row) + "\n" for row in itertools.islice(remaining, block)]:
            handle.write("".join(lines).encode())

    atomic_write_with(path, write)


def atomic_write_json(path: str | Path, value) -> None:
    atomic_write_bytes(path, (json.dumps(value, indent=1, ensure_ascii=False) + "\n").encode())


def atomic_save_npy(path: str | Path, array) -> None:
    """Streamed to the file: no copy of the array in memory (a million 384-d vectors are 1.5 GB)."""
    import numpy as np

    atomic_write_with(path, lambda handle: np.save(handle, np.asarray(array), allow_pickle=False))


def read_npy(path: str | Path):
    """A .npy file (no pickles) into an array that owns its memory, so that it can change size in
    place. The memory comes from growing a one-row array (a realloc): on Linux a later realloc
    of such a block remaps its pages, so adding rows to a million vectors neither copies them nor
    needs memory for two copies (a block from np.empty was copied on growth, measured)."""
    import numpy as np

    with open(path, "rb") as handle:
        version = np.lib.format.read_magic(handle)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran_order, dtype = read_header(handle)
        if dtype.hasobject or fortran_order:
            raise ValueError(f"{path}: holds Python objects or a Fortran-ordered array, which HyperProve does not write")
        array = np.empty((1, *shape[1:]) if shape else (), dtype=dtype)
        if shape:
            array.resize(shape, refcheck=False)
        if array.nbytes and handle.readinto(memoryview(array).cast("B")) != array.nbytes:
            raise ValueError(f"{path}: shorter than its header says")
    return array


def map_npy(path: str | Path):
    """A .npy file (no pickles) memory-mapped read only: rows are read from disk as they are
    used (the vectors searched by IVF-PQ codes, of which a search reads a few hundred rows)."""
    import numpy as np

    array = np.load(path, mmap_mode="r", allow_pickle=False)
    if array.dtype.hasobject or not array.flags.c_contiguous:
        raise ValueError(f"{path}: holds Python objects or a Fortran-ordered array, which HyperProve does not write")
    return array


def read_rows(vectors, start: int, stop: int):
    """Rows start..stop of an array; those of a memory-mapped one are read from its file, not
    through the mapping, so that reading every row leaves no page of the file counted in this
    process's memory."""
    import numpy as np

    if not isinstance(vectors, np.memmap):
        return vectors[start:stop]
    stop = min(stop, len(vectors))
    width = int(np.prod(vectors.shape[1:]))
    with open(vectors.filename, "rb") as handle:
        handle.seek(vectors.offset + start * width * vectors.itemsize)
        return np.fromfile(handle, dtype=vectors.dtype, count=(stop - start) * width).reshape(stop - start, *vectors.shape[1:])


def row_blocks(vectors, block: int = 65_536) -> Iterator:
    """(start, rows) of an array a block of rows at a time (`read_rows`)."""
    for start in range(0, len(vectors), block):
        yield start, read_rows(vectors, start, start + block)


def sha256_file(path: str | Path, block: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(block), b""):
            digest.update(chunk)
    return digest.hexdigest()


def sha256_files(paths: Sequence[str | Path]) -> list[str]:
    """sha256_file of each path, two files at a time: hashing releases the GIL, and a 1M-fact
    index is 3.5 GB to hash on every save and load."""

    with ThreadPoolExecutor(max_workers=2) as pool:
        return list(pool.map(sha256_file, paths))


def check_replaceable(target: str | Path, ours: Iterable[str] | None, what: str, flag: str = "--out") -> None:
    """Refuse, before any work, to write `what` over something that is not an earlier one: a
    file, or a non-empty folder with a name outside `ours` (None: the folder is not ours at all)."""
    target = Path(target)
    recover(target)
    if not target.exists():
        return
    if not target.is_dir():
        raise HyperProveError(f"{flag} {target}: is a file, not a folder for {what}")
    allowed = set(ours or ())
    strangers = sorted(entry.name for entry in target.iterdir() if ours is None or entry.name not in allowed)
    if strangers:
        raise HyperProveError(f"{flag} {target}: holds {strangers[0]!r}, which is not part of {what}; choose an empty or new folder")


MAX_OWN_FILE = 64 << 20  # bytes: an earlier output of ours is far smaller


def check_own_file(target: str | Path, ours: Callable[[object], bool], what: str, flag: str) -> None:
    """Refuse, before any work, to write `what` (a JSON file) over anything but an earlier one:
    a folder, a link, or a file whose JSON `ours` does not recognise (a `~/.bashrc`)."""
    target = Path(target)
    if target.is_dir():
        raise HyperProveError(f"{flag} {target}: is a folder; name the {what} file to write")
    if not target.exists() and not target.is_symlink():
        return
    try:
        recognised = (target.is_file() and not target.is_symlink() and target.stat().st_size <= MAX_OWN_FILE
                      and ours(json.loads(target.read_text(encoding="utf-8"))))
    except (OSError, ValueError, RecursionError):
        recognised = False
    if not recognised:
        raise HyperProveError(f"{flag} {target}: exists and is not {what}; this command replaces only an earlier one "
                              "of its own (name a new file, or remove that one yourself)")


@contextmanager
def atomic_directory(target: str | Path) -> Iterator[Path]:
    """Yield a scratch directory that replaces `target` only if the block finishes.

    On an exception (or Ctrl-C) the scratch directory is removed and `target` is untouched; a
    kill leaves scratch that the next write of `target` removes (see `recover`).
    """
    target = Path(target)
    recover(target)
    scratch = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    try:
        yield scratch
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    retired = target.with_name(f".{target.name}.old-{os.getpid()}")
    if target.exists():
        os.replace(target, retired)
    os.replace(scratch, target)
    shutil.rmtree(retired, ignore_errors=True)


_HELD = threading.local()  # per thread: lock files it holds -> how many blocks hold each


def lock_path(target: str | Path) -> Path:
    """The lock file of a folder or file: beside it (`.NAME.lock`), since the target itself is
    replaced by a rename while it is held."""
    target = Path(target).absolute()
    return target.with_name(f".{target.name}.lock")


@contextmanager
def writer_lock(target: str | Path, log: Callable[[str], None] | None = None) -> Iterator[None]:
    """Hold the one writer's lock of `target` (an exclusive `flock` of its lock file) for the
    block, waiting for any other holder (another process or thread), with one line saying so.
    Held again by the same thread (a save inside an update), it does not wait for itself. The
    kernel frees the lock of a killed process, so a kill never leaves it held."""

    path = lock_path(target)
    held = _HELD.__dict__.setdefault("counts", {})
    if held.get(str(path)):
        held[str(path)] += 1
        try:
            yield
        finally:
            held[str(path)] -= 1
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:  # closing the descriptor releases the lock
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            if log is not None:
                log(f"{target}: {handle.read().strip() or 'another process'} is writing it; waiting for it to finish")
            fcntl.flock(handle, fcntl.LOCK_EX)
        handle.seek(0)
        handle.truncate()
        handle.write(f"process {os.getpid()}")
        handle.flush()
        held[str(path)] = 1
        try:
            yield
        finally:
            held.pop(str(path), None)
