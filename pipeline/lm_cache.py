"""The LM cache: DSPy's cache with its disk tier as JSON rows in one SQLite file, never pickles.

DSPy's own disk cache stores pickles, and its restricted unpickler trusts every name under
`litellm.types.*`; with a dotted name (pickle protocol 4) that reaches any global, so one crafted
row in a shared cache folder runs code when the row is looked up. Here a row is the request and
the response as JSON text: a row that does not parse as a chat completion is a miss, and the
worst a planted row can do is change an answer (which a shared cache can always do).
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Callable

from dspy.clients.cache import Cache

logger = logging.getLogger(__name__)

STORE_FILE = "lm-responses.sqlite3"
RESPONSE_KIND = "chat.completion"  # the only value stored: a LiteLLM ModelResponse of a chat completion


def response_data(value: Any) -> dict | None:
    """A chat completion as plain JSON data; None for any other value (kept in memory only)."""
    from litellm import ModelResponse

    if type(value) is not ModelResponse:
        return None
    try:
        data = value.model_dump(mode="json")
        json.dumps(data)
        return data
    except (TypeError, ValueError):
        return None


def to_json(value: Any) -> str | None:
    """A chat completion as the JSON text of a row; None for any other value."""
    data = response_data(value)
    return None if data is None else json.dumps({"kind": RESPONSE_KIND, "response": data}, ensure_ascii=False)


def response_from_data(data: Any):
    """The ModelResponse of `response_data`'s output, or None when `data` is anything else."""
    from litellm import ModelResponse

    if not isinstance(data, dict):
        return None
    try:
        response = ModelResponse(**data)
        response.choices[0].message.content  # a completion that cannot be read is no answer
        return response
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, RecursionError):
        return None


def from_json(text: str):
    """The ModelResponse a row holds, or None when the row is anything else."""
    try:
        row = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(row, dict) or row.get("kind") != RESPONSE_KIND:
        return None
    return response_from_data(row.get("response"))


class ResponseStore:
    """key -> (request, response) as JSON text in SQLite: one file, safe for threads and for
    several processes at once (WAL, a wait on a locked database)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, timeout=60, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS responses (key TEXT PRIMARY KEY, request TEXT NOT NULL, "
                         "response TEXT NOT NULL, stored REAL NOT NULL)")

    def get(self, key: str):
        with self._lock:
            row = self._db.execute("SELECT response FROM responses WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        if not isinstance(row[0], str) or (value := from_json(row[0])) is None:
            logger.warning("LM cache %s: the row of %s is not a chat completion in JSON; ignored", self.path, key[:12])
            return None
        return value

    def put(self, key: str, request: str, response: str) -> None:
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?)", (key, request, response, time.time()))

    def __contains__(self, key: str) -> bool:
        with self._lock:
            return self._db.execute("SELECT 1 FROM responses WHERE key = ?", (key,)).fetchone() is not None

    def __len__(self) -> int:
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM responses").fetchone()[0]


def request_data(request: dict[str, Any], ignored_args_for_cache_key: list[str] | None = None) -> dict:
    """The request as the cache keys it (without the API key and endpoint), as plain JSON data."""
    params = {k: v for k, v in request.items() if k not in (ignored_args_for_cache_key or [])}
    return json.loads(json.dumps(params, ensure_ascii=False, default=str))


Listener = Callable[[str, dict, dict], None]  # (cache key, request data, response data) of one LM call


class JSONCache(Cache):
    """DSPy's `Cache` (same keys, same in-memory tier, same cache-hit marking) whose disk tier is
    a `ResponseStore`; set as `dspy.cache` by `configure_lm_cache`. Every call it sees, answered
    here or by the LM, goes to its `listeners` (`pipeline.lm_record.CallRecord` records a run's calls)."""

    def __init__(self, directory: str | Path):
        super().__init__(enable_disk_cache=False, enable_memory_cache=True, disk_cache_dir=None)
        self.store = ResponseStore(Path(directory) / STORE_FILE)
        self.listeners: list[Listener] = []

    def __contains__(self, key: str) -> bool:
        return key in self.memory_cache or key in self.store

    def get(self, request: dict[str, Any], ignored_args_for_cache_key: list[str] | None = None) -> Any:
        try:
            key = self.cache_key(request, ignored_args_for_cache_key)
        except Exception:  # DSPy's own rule: a request it cannot key is not cached
            return None
        with self._lock:
            response = self.memory_cache.get(key)
        if response is None:
            response = self.store.get(key)
            if response is None:
                return None
            with self._lock:
                self.memory_cache[key] = response
        self.heard(key, request, ignored_args_for_cache_key, response)
        return self._prepare_cached_response(response)

    def put(self, request: dict[str, Any], value: Any, ignored_args_for_cache_key: list[str] | None = None,
            enable_memory_cache: bool = True) -> None:
        super().put(request, value, ignored_args_for_cache_key, enable_memory_cache)
        response = to_json(value)
        if response is None:
            return
        try:
            key = self.cache_key(request, ignored_args_for_cache_key)
            self.store.put(key, json.dumps(request_data(request, ignored_args_for_cache_key), ensure_ascii=False), response)
        except Exception as error:  # as DSPy's disk tier: a value that cannot be stored is only not cached
            logger.debug("LM cache: not stored (%s)", error)
        else:
            self.heard(key, request, ignored_args_for_cache_key, value)

    def heard(self, key: str, request: dict[str, Any], ignored_args_for_cache_key: list[str] | None, response: Any) -> None:
        """Tell the listeners of one call (a chat completion; any other value is not recorded)."""
        if not self.listeners or (data := response_data(response)) is None:
            return
        params = request_data(request, ignored_args_for_cache_key)
        for listener in self.listeners:
            listener(key, params, data)
