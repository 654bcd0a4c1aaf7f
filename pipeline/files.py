"""File helpers: atomic writes (a reader sees the old file or the new one, never half of one),
checksums, and JSON reads that fail with one line naming the file."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np

from modules.errors import HyperProveError


def read_json(path: str | Path, what: str, damaged_hint: str = ""):
    """Parse a JSON file; a missing, non-UTF-8 or malformed file is a one-line HyperProveError."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise HyperProveError(f"{path}: {what} file not found") from None
    except UnicodeDecodeError:
        raise HyperProveError(f"{path}: not UTF-8 text") from None
    except json.JSONDecodeError as error:
        raise HyperProveError(f"{path}: not valid JSON ({error.msg}, line {error.lineno}){damaged_hint}") from None


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(temporary, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


def atomic_write_json(path: str | Path, value) -> None:
    atomic_write_bytes(path, (json.dumps(value, indent=1, ensure_ascii=False) + "\n").encode())


def atomic_save_npy(path: str | Path, array: np.ndarray) -> None:
    buffer = io.BytesIO()
    np.save(buffer, np.asarray(array), allow_pickle=False)
    atomic_write_bytes(path, buffer.getvalue())


def sha256_file(path: str | Path, block: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(block), b""):
            digest.update(chunk)
    return digest.hexdigest()


@contextmanager
def atomic_directory(target: str | Path) -> Iterator[Path]:
    """Yield a scratch directory that replaces `target` only if the block finishes.

    On an exception (or Ctrl-C) the scratch directory is removed and `target` is untouched.
    """
    target = Path(target)
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
