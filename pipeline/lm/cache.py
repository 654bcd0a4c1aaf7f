"""The LM cache: DSPy's cache with its disk tier as JSON rows in one SQLite file, never pickles.

DSPy's own disk cache stores pickles, and its restricted unpickler trusts every name under
`litellm.types.*`; with a dotted name (pickle protocol 4) that reaches any global, so one crafted
row in a shared cache folder runs code when the row is looked up. Here a row is the request and
the reply as JSON text (a LiteLLM chat completion, or the plain-data record DSPy's native engine
caches): a row that does not parse as one is a miss, and the worst a planted row can do is change
an answer (which a shared cache can always do).
"""

from __future__ import annotations

import json
import logging
import sqlite3
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from dspy.clients.cache import Cache
from dspy.clients.call_result import CACHE_FORMAT, CallResult

logger = logging.getLogger(__name__)

STORE_FILE = "lm-responses.sqlite3"
# The two kinds of value DSPy's LM cache holds, both stored as plain JSON data:
CHAT_COMPLETION = "chat.completion"  # DSPy's LiteLLM engine: a LiteLLM ModelResponse
NATIVE_RESULT = CACHE_FORMAT  # DSPy's native engine (the embedded model, OpenAI-compatible servers): its own plain-data record


def response_data(value: Any) -> dict | None:
    """A value DSPy's LM cache holds, as plain JSON data (`{"kind", "response"}`); None for any
    other value (kept in memory only)."""
    litellm = sys.modules.get("litellm")  # a LiteLLM reply exists only where LiteLLM was imported (importing it costs seconds)

    if litellm is not None and type(value) is litellm.ModelResponse:
        kind, data = CHAT_COMPLETION, value.model_dump(mode="json")
    elif isinstance(value, dict) and value.get("_dspy_format") == NATIVE_RESULT:
        kind, data = NATIVE_RESULT, value
    else:
        return None
    try:
        return {"kind": kind, "response": json.loads(json.dumps(data, ensure_ascii=False))}
    except (TypeError, ValueError, RecursionError):
        return None


def response_from_data(row: Any):
    """The cached value a `response_data` row holds, checked; None when the row is anything else
    or holds no readable reply."""
    if not isinstance(row, dict) or not isinstance(data := row.get("response"), dict):
        return None
    try:
        if row.get("kind") == CHAT_COMPLETION:
            from litellm import ModelResponse  # imported only here: importing LiteLLM costs seconds

            response = ModelResponse(**data)
            response.choices[0].message.content  # a completion that cannot be read is no answer
            return response
        if row.get("kind") == NATIVE_RESULT and data.get("_dspy_format") == NATIVE_RESULT:
            CallResult.load(data).outputs[0]  # as DSPy will load it
            return data
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, RecursionError):
        return None
    return None


def reply_text(row: dict) -> str | None:
    """The text the LM replied, from a `response_data` row that `response_from_data` accepts."""
    value = response_from_data(row)
    if row["kind"] == CHAT_COMPLETION:
        return value.choices[0].message.content
    output = CallResult.load(value).outputs[0]
    return output.get("text") if isinstance(output, dict) else output


def from_json(text: str):
    """The cached value a row holds, or None when the row is anything else."""
    try:
        return response_from_data(json.loads(text))
    except (ValueError, RecursionError):
        return None


class ResponseStore:
    """key -> (request, response) as JSON text in SQLite: one file, safe for threads and for
    several processes at once (WAL, a wait on a locked database)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, timeout=60, check_same_thread=False, isolation_level=None)
        # Several processes opening a new store at once (Ray workers sharing the cache dir): switching
        # to WAL can answer "database is locked" at once, without SQLite's wait, so it is asked again.
        deadline = time.monotonic() + 60
        while True:
            try:
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute("CREATE TABLE IF NOT EXISTS responses (key TEXT PRIMARY KEY, request TEXT NOT NULL, "
                                 "response TEXT NOT NULL, stored REAL NOT NULL)")
                break
            except sqlite3.OperationalError as error:
                if "locked" not in str(error) or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def get(self, key: str):
        with self._lock:
            row = self._db.execute("SELECT response FROM responses WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        if not isinstance(row[0], str) or (value := from_json(row[0])) is None:
            logger.warning("LM cache %s: the row of %s is not an LM reply in JSON; ignored", self.path, key[:12])
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


# Connection settings that shape no reply, besides those DSPy leaves out of its key (API key and
# endpoint): the request timeout, so that choosing one keeps every cached and recorded call's key.
UNKEYED = ("timeout",)


def unkeyed(ignored_args_for_cache_key: list[str] | None) -> list[str]:
    return [*(ignored_args_for_cache_key or []), *UNKEYED]


def request_data(request: dict[str, Any], ignored_args_for_cache_key: list[str] | None = None) -> dict:
    """The request as the cache keys it (without the API key, endpoint and timeout), as plain JSON data."""
    params = {k: v for k, v in request.items() if k not in unkeyed(ignored_args_for_cache_key)}
    return json.loads(json.dumps(params, ensure_ascii=False, default=str))


Listener = Callable[[str, dict, dict], None]  # (cache key, request data, reply as `response_data`) of one LM call


class JSONCache(Cache):
    """DSPy's `Cache` (same keys, same in-memory tier, same cache-hit marking) whose disk tier is
    a `ResponseStore`; set as `dspy.cache` by `configure_lm_cache`. Every call it sees, answered
    here or by the LM, goes to its `listeners` (`pipeline.lm.record.CallRecord` records a run's calls)."""

    def __init__(self, directory: str | Path):
        super().__init__(enable_disk_cache=False, enable_memory_cache=True, disk_cache_dir=None)
        self.store = ResponseStore(Path(directory) / STORE_FILE)
        self.listeners: list[Listener] = []

    def __contains__(self, key: str) -> bool:
        return key in self.memory_cache or key in self.store

    def cache_key(self, request: dict[str, Any], ignored_args_for_cache_key: list[str] | None = None) -> str:
        """DSPy's key, without the connection settings that shape no reply (`UNKEYED`)."""
        return super().cache_key(request, unkeyed(ignored_args_for_cache_key))

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
        if self.listeners:
            self.tell(key, request_data(request, ignored_args_for_cache_key), response_data(response))
        return self._prepare_cached_response(response)

    def put(self, request: dict[str, Any], value: Any, ignored_args_for_cache_key: list[str] | None = None,
            enable_memory_cache: bool = True) -> None:
        super().put(request, value, ignored_args_for_cache_key, enable_memory_cache)
        reply = response_data(value)
        if reply is None:
            return
        try:
            key = self.cache_key(request, ignored_args_for_cache_key)
            params = request_data(request, ignored_args_for_cache_key)
            self.store.put(key, json.dumps(params, ensure_ascii=False), json.dumps(reply, ensure_ascii=False))
        except Exception as error:  # as DSPy's disk tier: a value that cannot be stored is only not cached
            logger.debug("LM cache: not stored (%s)", error)
        else:
            self.tell(key, params, reply)

    def tell(self, key: str, params: dict, reply: dict | None) -> None:
        """Tell the listeners of one call: its key, its request and its reply as plain data (a
        reply `response_data` cannot take, None, is not told)."""
        if reply is not None:
            for listener in self.listeners:
                listener(key, params, reply)
