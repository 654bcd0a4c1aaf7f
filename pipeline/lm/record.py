"""A run's LM calls as data: recorded while it runs, written beside its results, replayed by a rerun.

Every LM call passes the LM cache (`pipeline.lm.cache.JSONCache`) under DSPy's cache key (the
request without the API key and endpoint), answered there or by the LM. `CallRecord` hears each
one and keeps, once per request, the request as sent (model, messages, sampling settings), the
reply (`kind` and `response`, as `pipeline.lm.cache.response_data` gives them), and who asked
(system, question id, LM module). `lm_calls.jsonl.gz` is that record:
gzip'd JSON lines, a header line and then one line per request; results.json names its sha256.

`ReplayCache` answers a rerun from a record. A request the record lacks stops the run
(`UnrecordedCall`) with its LM module, its question and where it departs from the nearest recorded
request, unless `live` lets it through to the LM (then only the calls an option changes are new).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import threading
import zlib
from pathlib import Path
from typing import Any, Iterable

import dspy
from dspy.clients.cache import Cache

from modules.errors import HyperProveError, UnrecordedCall
from pipeline.config import replay_sources
from pipeline.files import atomic_write_bytes, read_json
from pipeline.lm.cache import JSONCache, reply_text, request_data, response_from_data
from pipeline.lm.profile import module_of
from pipeline.scope import current

RECORD_FILE = "lm_calls.jsonl.gz"
RECORD_FORMAT, RECORD_VERSION = "hyperprove.lm_calls", 1
MAX_RECORD_BYTES = 1 << 30  # uncompressed, at most: a record is read a line at a time, but kept whole
MAX_RECORD_LINE = 64 << 20  # characters of one recorded call

def current_asker() -> dict:
    """Who is asking now: the system and question of the scope (`pipeline.scope`), the LM module
    from DSPy's module stack (stored under `step`, the key records were written with)."""

    scope = current()
    return {"system": scope.system, "question": scope.question, "step": module_of(dspy.settings.caller_modules)}


class CallRecord:
    """The LM calls of one run, once per request, in the order first asked; thread-safe.
    `observe` is a `JSONCache` listener."""

    def __init__(self, calls: Iterable[dict] = (), replaying: "Record | None" = None):
        self._lock = threading.Lock()
        self.calls: dict[str, dict] = {}
        self.replaying = replaying  # the record this run replays, if any: its summary says how many calls came from there
        self.add(calls)

    def add(self, calls: Iterable[dict]) -> None:
        """Calls recorded earlier (an interrupted run's finished systems)."""
        with self._lock:
            for call in calls:
                kept = self.calls.setdefault(call["key"], {**call, "asked_by": []})
                kept["asked_by"].extend(a for a in call["asked_by"] if a not in kept["asked_by"])

    def observe(self, key: str, request: dict, reply: dict) -> None:
        """One call: its key, its request as data, its reply as `pipeline.lm.cache.response_data` gives it."""
        self.add([{"key": key, "asked_by": [current_asker()], "request": request, **reply}])

    def __len__(self) -> int:
        with self._lock:
            return len(self.calls)

    def asked_for(self, system: str, questions: set[str]) -> list[dict]:
        """The calls `system` made for these questions (by id), each with only those askers: what
        a worker hands back to the driver's record."""
        with self._lock:
            calls = [(call, [a for a in call["asked_by"] if a.get("system") == system and a.get("question") in questions])
                     for call in self.calls.values()]
        return [{**call, "asked_by": askers} for call, askers in calls if askers]

    def to_bytes(self) -> bytes:
        """The record file's bytes: the same calls give the same bytes (no time in the gzip header)."""
        with self._lock:
            rows = [dict(call) for call in self.calls.values()]
        lines = [json.dumps({"format": RECORD_FORMAT, "version": RECORD_VERSION, "calls": len(rows)})]
        lines += [json.dumps(row, ensure_ascii=False, sort_keys=True) for row in rows]
        buffer = io.BytesIO()
        with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0, compresslevel=9) as out:
            out.write(("\n".join(lines) + "\n").encode("utf-8"))
        return buffer.getvalue()

    def write(self, path: Path) -> dict:
        """Write the record to `path` (atomically); returns what results.json says of it."""

        data = self.to_bytes()
        atomic_write_bytes(Path(path), data)
        summary = {"file": Path(path).name, "calls": len(self), "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        if (replayed := self.replayed()) is not None:
            summary["replayed"] = replayed
        return summary

    def replayed(self) -> dict | None:
        """How many of these calls the replayed record answered, and which record that is (None
        when the run replays none)."""
        if self.replaying is None:
            return None
        with self._lock:
            shared = sum(key in self.replaying.calls for key in self.calls)
        return {"from": str(self.replaying.path), "calls": shared}


# --- reading a record ----------------------------------------------------------------------------
def record_file(source: str | Path) -> tuple[Path, str | None]:
    """The record a `--replay` names (a results folder or the file itself) and the sha256 the
    folder's results.json gives for it (None for a file named directly)."""

    path = Path(source)
    if not path.is_dir():
        return path, None
    expected = None
    if (path / "results.json").is_file():
        named = read_json(path / "results.json", "results").get("lm_calls")
        if not isinstance(named, dict) or not isinstance(named.get("sha256"), str):
            raise HyperProveError(f"{path}/results.json: names no recorded LM calls (an evaluation without the LM, "
                                  "or made before runs recorded their calls)")
        expected = named["sha256"]
    return path / RECORD_FILE, expected


def record_header(path: Path, line: str) -> dict:
    """A record's first line, checked: its format, version and count of calls."""
    try:
        header = json.loads(line)
    except (ValueError, RecursionError):
        header = None
    if not isinstance(header, dict) or header.get("format") != RECORD_FORMAT or header.get("version") != RECORD_VERSION:
        raise HyperProveError(f"{path}: line 1 is not a {RECORD_FORMAT} header of version {RECORD_VERSION}")
    if isinstance(header.get("calls"), bool) or not isinstance(header.get("calls"), int) or header["calls"] < 0:
        raise HyperProveError(f"{path}: line 1: its count of calls is not a whole number")
    return header


def record_row(path: Path, number: int, line: str, keyer) -> dict:
    """One recorded call, checked: its shape, and that its request gives its key (a request
    edited in place is caught here)."""
    try:
        row = json.loads(line)
    except (ValueError, RecursionError):
        raise HyperProveError(f"{path}: line {number} is not JSON" + (" (it is empty)" if not line.strip() else "")) from None
    if not (isinstance(row, dict) and isinstance(row.get("key"), str) and isinstance(row.get("request"), dict)
            and isinstance(row.get("asked_by"), list) and response_from_data(row) is not None):
        raise HyperProveError(f"{path}: line {number} is not a recorded call (key, request, kind, response, asked_by)")
    try:
        key = keyer.cache_key(row["request"])
    except (TypeError, ValueError):  # e.g. an integer orjson cannot write
        key = None
    if key != row["key"]:
        raise HyperProveError(f"{path}: line {number}: its request does not give its key, or the key is there twice (edited?)")
    return row


def read_record(source: str | Path) -> "Record":
    """A record, checked: its sha256 against results.json, its header, every row's shape, and that
    each row's request gives its key; read a line at a time, so that memory stays that of the
    calls whatever the file holds."""

    path, expected = record_file(source)
    if not path.is_file():
        raise HyperProveError(f"{path}: no recorded LM calls here")
    if path.stat().st_size > MAX_RECORD_BYTES:
        raise HyperProveError(f"{path}: over {MAX_RECORD_BYTES >> 20} MiB; not read")
    data = path.read_bytes()
    if expected is not None and hashlib.sha256(data).hexdigest() != expected:
        raise HyperProveError(f"{path}: differs from the record its results.json names (sha256 mismatch): edited or damaged; not replaying")
    keyer = Cache(enable_disk_cache=False, enable_memory_cache=False, disk_cache_dir=None)
    calls: dict[str, dict] = {}
    header, read = None, 0
    try:
        with io.TextIOWrapper(gzip.GzipFile(fileobj=io.BytesIO(data)), encoding="utf-8", newline="\n") as lines:
            # a line at a time, each at most MAX_RECORD_LINE characters: memory is that of the calls, not of the file
            for number, line in enumerate(iter(lambda: lines.readline(MAX_RECORD_LINE + 1), ""), start=1):
                read += len(line)
                if read > MAX_RECORD_BYTES:
                    raise HyperProveError(f"{path}: over {MAX_RECORD_BYTES >> 20} MiB uncompressed; not read")
                if len(line) > MAX_RECORD_LINE:
                    raise HyperProveError(f"{path}: line {number} is over {MAX_RECORD_LINE >> 20} MiB; not a recorded call")
                if header is None:
                    header = record_header(path, line)
                else:
                    if len(calls) == header["calls"]:
                        raise HyperProveError(f"{path}: its header says {header['calls']} calls, it holds more")
                    row = record_row(path, number, line, keyer)
                    if row["key"] in calls:
                        raise HyperProveError(f"{path}: line {number}: its request does not give its key, or the key is there twice (edited?)")
                    calls[row["key"]] = row
    except (OSError, EOFError, UnicodeDecodeError, zlib.error):
        raise HyperProveError(f"{path}: not a gzip'd JSON lines record of LM calls") from None
    if header is None:
        raise HyperProveError(f"{path}: not a gzip'd JSON lines record of LM calls (it is empty)")
    if header["calls"] != len(calls):
        raise HyperProveError(f"{path}: its header says {header['calls']} calls, it holds {len(calls)}")
    return Record(path, calls)


def read_records(sources: str) -> "Record":
    """The records a `--replay` names (`replay_sources`, each part's record committed): one record
    of all their calls, each checked as `read_record` checks it; where two hold the same request,
    the first named answers it."""
    records = [read_record(source) for source in replay_sources(sources)]
    if len(records) == 1:
        return records[0]
    calls: dict[str, dict] = {}
    for record in records:
        for key, call in record.calls.items():
            calls.setdefault(key, call)
    return Record(", ".join(str(record.path) for record in records), calls)


class Record:
    """A read record: its calls by key, each call's response, and what to say when a request misses."""

    def __init__(self, path: Path | str, calls: dict[str, dict]):
        self.path, self.calls = path, calls  # path: the file, or the files' names when several are replayed as one

    def response(self, key: str):
        """The value DSPy's cache would hold for one recorded request."""
        return response_from_data(self.calls[key])

    def reply(self, key: str) -> str | None:
        """The text the LM replied to one recorded request."""
        return reply_text(self.calls[key])

    def shared_with(self, other: "Record") -> tuple[int, int]:
        """How many requests both records hold, and of those how many got the same reply."""
        both = self.calls.keys() & other.calls.keys()
        return len(both), sum(self.reply(key) == other.reply(key) for key in both)

    def unrecorded(self, request: dict, asker: dict) -> UnrecordedCall:
        """The error for a request the record lacks: who asked, and where the nearest recorded
        request departs from it."""
        near, relation = self.nearest(request, asker)
        where = f"; the nearest recorded request ({relation}) {departure(near['request'], request)}" if near else "; the record is empty"
        return UnrecordedCall(f"an LM call not in the record {self.path}: LM module {asker['step']}, question {asker['question']} "
                              f"(system {asker['system']}){where}; pass --live to send new calls to the LM")

    def nearest(self, request: dict, asker: dict) -> tuple[dict | None, str]:
        """The recorded call sharing the longest start of its messages with `request`, among those
        of the same question and LM module if any, else of the same LM module, else all."""
        def asked(call: dict, same: tuple[str, ...]) -> bool:
            return any(all(other.get(k) == asker[k] for k in same) for other in call["asked_by"] if isinstance(other, dict))

        text = messages_text(request)
        for same, relation in ((("question", "step"), "same question and LM module"), (("step",), "same LM module"), ((), "any")):
            candidates = [call for call in self.calls.values() if asked(call, same)]
            if candidates:
                return max(candidates, key=lambda call: common_start(messages_text(call["request"]), text)), relation
        return None, ""


def messages_text(request: dict) -> str:
    return json.dumps(request.get("messages"), ensure_ascii=False)


def common_start(a: str, b: str) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def departure(recorded: dict, asked: dict, width: int = 60) -> str:
    """Where `asked` first differs from `recorded`: a setting, or a message's text at a character."""
    def cut(value: Any, at: int = 0) -> str:
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        return repr(text[max(at - width // 3, 0): at + width])

    for name in sorted((set(recorded) | set(asked)) - {"messages"}):
        if recorded.get(name) != asked.get(name):
            return f"differs in {name}: recorded {cut(recorded.get(name))}, now {cut(asked.get(name))}"
    before, now = recorded.get("messages") or [], asked.get("messages") or []
    for number, (old, new) in enumerate(zip(before, now)):
        if old != new:
            old_text, new_text = str(old.get("content")), str(new.get("content"))
            at = common_start(old_text, new_text)
            return f"differs in message {number} ({new.get('role')}) at character {at}: recorded {cut(old_text, at)}, now {cut(new_text, at)}"
    return f"has {len(before)} messages, this one {len(now)}"


class ReplayCache(JSONCache):
    """The LM cache of a replayed run: the record answers first; a request it lacks raises
    `UnrecordedCall`, or with `live` goes on to the cache and the LM as in any run."""

    def __init__(self, directory: str | Path, record: Record, live: bool = False):
        super().__init__(directory)
        self.record, self.live = record, live

    def get(self, request: dict[str, Any], ignored_args_for_cache_key: list[str] | None = None) -> Any:
        try:
            key = self.cache_key(request, ignored_args_for_cache_key)
        except Exception:
            key = None
        if key in self.record.calls:
            call = self.record.calls[key]
            self.tell(key, call["request"], {"kind": call["kind"], "response": call["response"]})
            return self._prepare_cached_response(self.record.response(key))
        if self.live:
            return super().get(request, ignored_args_for_cache_key)
        raise self.record.unrecorded(request_data(request, ignored_args_for_cache_key), current_asker())
