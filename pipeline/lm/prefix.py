"""Pinned prefixes: every chat request to the embedded model starts from the same model state.

llama.cpp reuses the longest prefix a slot already holds and computes the rest. The numbers it
computes depend on how the rest is cut into batches (a repeated prompt recomputes one token, a
new one hundreds), and a greedy token can flip with them: the same request gave another answer
after other requests. Here the fixed part of a request, every message before its last user
message (a step's instructions and demonstrations), is computed once in a slot emptied first,
its state saved to a file named by its hash, and restored into the slot before each request
that shares it. What the
slot holds when the request arrives is then the same bytes every time, and only the question's
own part is computed, in the same batches. Restoring also keeps each step's prefix warm across
the steps of a question, which one slot's cache alone would lose at every change of step.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

Post = Callable[[str, dict], dict]  # (route, JSON body) -> JSON reply of the llama.cpp server
KEPT_STATES = 32  # saved prefix states kept, the least recently used removed first (2,000 tokens: 57 MB)


class PinnedPrefixes:
    """Runs chat requests on llama.cpp's slots, each from its prefix's saved state.

    `post` sends to the server, `folder` is the server's `slot_save_path` (where states are
    saved, one file a prefix), `slots` how many requests run at once."""

    def __init__(self, post: Post, folder: Path, slots: int):
        self.post = post
        self.folder = Path(folder)
        self.free: queue.Queue[int] = queue.Queue()
        for slot in range(slots):
            self.free.put(slot)

    @contextmanager
    def slot(self) -> Iterator[int]:
        """A slot no other request uses until this one is done."""
        slot = self.free.get()
        try:
            yield slot
        finally:
            self.free.put(slot)

    def chat(self, body: dict) -> dict:
        """The reply to an OpenAI chat request, computed from its prefix's state."""
        messages = body.get("messages") or []
        fixed = fixed_part(messages)
        if not fixed or body.get("stream"):
            return self.post("/v1/chat/completions", body)
        name = state_name(fixed)
        with self.slot() as slot:
            if not self._restore(slot, name):
                self._compute(slot, fixed, messages, name)
            return self.post("/v1/chat/completions", {**body, "id_slot": slot, "cache_prompt": True})

    def _restore(self, slot: int, name: str) -> bool:
        if not (self.folder / name).exists():
            return False
        try:
            self.post(f"/slots/{slot}?action=restore", {"filename": name})
            os.utime(self.folder / name)  # used: the last to be removed
            return True
        except OSError:  # a state file llama.cpp cannot read (damaged): computed again
            return False

    def _compute(self, slot: int, fixed: list[dict], messages: list[dict], name: str) -> None:
        """The prefix's state, from an empty slot, saved under `name` (written aside, then renamed:
        a killed save leaves no state that looks whole). The prefix is the text the prefix's
        messages and the whole request share: a template may close the last prefix message
        differently when another message follows."""
        alone = self.post("/apply-template", {"messages": fixed})["prompt"]
        whole = self.post("/apply-template", {"messages": messages})["prompt"]
        prefix = os.path.commonprefix([alone, whole])
        self.post(f"/slots/{slot}?action=erase", {})
        self.post("/completion", {"prompt": prefix, "n_predict": 0, "cache_prompt": True, "id_slot": slot})
        scratch = f".{name}.tmp-{os.getpid()}-{slot}"  # two slots may compute one prefix at once
        self.post(f"/slots/{slot}?action=save", {"filename": scratch})
        os.replace(self.folder / scratch, self.folder / name)
        states = sorted(self.folder.glob("*.bin"), key=lambda path: path.stat().st_mtime_ns)
        for stale in states[:-KEPT_STATES]:
            stale.unlink(missing_ok=True)


def fixed_part(messages: list[dict]) -> list[dict]:
    """The messages before the last user message: a step's instructions and demonstrations (a
    reply begun for the model, which follows the question, is not part of it)."""
    asked = [k for k, message in enumerate(messages) if message.get("role") == "user"]
    return messages[: asked[-1]] if asked else []


def state_name(prefix: list[dict]) -> str:
    """The file of a prefix's saved state: a hash of its messages."""
    return hashlib.sha256(json.dumps(prefix, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:32] + ".bin"


class UpstreamError(OSError):
    """The llama.cpp server answered with an error status: passed on to the client as it came."""

    def __init__(self, status: int, body: bytes):
        super().__init__(f"HTTP {status}")
        self.status, self.body = status, body


def send(url: str, data: bytes | None, method: str = "POST", kind: str = "application/json",
         timeout: float | None = None) -> tuple[int, bytes, str | None]:
    """One HTTP request: the status, body and content type of the reply, error statuses
    included (a server that cannot be reached raises OSError)."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": kind})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            return reply.status, reply.read(), reply.headers.get("Content-Type")
    except urllib.error.HTTPError as failure:
        return failure.code, failure.read(), failure.headers.get("Content-Type")


def poster(upstream: str, timeout: float | None = None) -> Post:
    """`Post` to the llama.cpp server at `upstream` (its error replies raise `UpstreamError`)."""

    def post(route: str, body: dict) -> dict:
        status, raw, _ = send(upstream + route, json.dumps(body).encode(), timeout=timeout)
        if status >= 400:
            raise UpstreamError(status, raw)
        return json.loads(raw)

    return post


class PinningFront:
    """An address on loopback in front of the llama.cpp server at `upstream`: chat requests
    (`POST /v1/chat/completions`) run through `PinnedPrefixes`, any other request is passed on
    as it came (`/health`, the rest of the OpenAI API). Requests are answered in threads of their
    own, so several wait for slots at once."""

    def __init__(self, pins: PinnedPrefixes, upstream: str):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        def unanswered(failure: Exception) -> dict:
            return {"error": {"message": f"the embedded model's server did not answer ({type(failure).__name__})"}}

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - the name http.server calls
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path.split("?")[0] != "/v1/chat/completions":
                    return self.pass_on("POST", body)
                try:
                    self.reply(200, pins.chat(json.loads(body)))
                except UpstreamError as failure:
                    self.reply(failure.status, failure.body)
                except (ValueError, OSError) as failure:
                    self.reply(502, unanswered(failure))

            def do_GET(self):  # noqa: N802
                self.pass_on("GET", None)

            def pass_on(self, method: str, body: bytes | None) -> None:
                try:
                    self.reply(*send(upstream + self.path, body, method, self.headers.get("Content-Type", "application/json")))
                except OSError as failure:
                    self.reply(502, unanswered(failure))

            def reply(self, status: int, payload, kind: str | None = None) -> None:
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", kind or "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args) -> None:  # quiet: the LM profile records every call
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.address = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
